//! The chart through real Helm: Helm 4 as a library (the helm-sdkpy package; .ci/run installs it),
//! driven by tests/e2e/helm/helm.py, against the simulated cluster over HTTP. Helm lints the chart,
//! installs it and waits for it as `helm install --wait` does, and upgrades it with changed values; what
//! it installed is compared object by object with `kubectl kustomize` of the kustomize tree, alerts and
//! dashboard included, and the image pinned by deploy/image/pin.sh is the same in both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};

use super::kustomize::{kustomize_dir, normalized_objects};

/// One Helm action, waits included (helm.py gives Helm 120 s of its own).
const HELM_TIMEOUT: Duration = Duration::from_secs(180);
const NS: &str = "snapdrain";
const RELEASE: &str = "snapdrain";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A simulated cluster with nodes (the quickstart scenario: the two replicas need two nodes) and a
/// kubeconfig file for Helm.
struct Cluster {
    sim: SimCluster,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Cluster {
    async fn start() -> Self {
        let sim = SimCluster::start(SimConfig {
            scenario: Some(ScenarioSource::Named("quickstart".into())),
            ..Default::default()
        })
        .await
        .expect("the simulated cluster starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = sim
            .write_kubeconfig(&dir.path().join("kubeconfig"))
            .expect("kubeconfig written");
        Self {
            sim,
            dir,
            kubeconfig,
        }
    }

    fn client(&self) -> kube::Client {
        kube::Client::try_from(self.sim.kube_config()).expect("a kube client")
    }

    /// `helm.py KUBECONFIG snapdrain ACTION ARGS...`: Helm's answer, or its error message.
    async fn helm(&self, action: &str, args: &[&str]) -> Result<Value, String> {
        run_helm(&self.kubeconfig, self.dir.path(), action, args).await
    }
}

async fn run_helm(
    kubeconfig: &Path,
    home: &Path,
    action: &str,
    args: &[&str],
) -> Result<Value, String> {
    let script = root().join("tests/e2e/helm/helm.py");
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(kubeconfig)
        .arg(NS)
        .arg(action)
        .args(args)
        // Helm's cache, config and data directories: private to this test.
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .env_remove("HELM_NAMESPACE")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(HELM_TIMEOUT, out)
        .await
        .unwrap_or_else(|_| panic!("helm {action} did not finish in {HELM_TIMEOUT:?}"))
        .expect("python3 runs (install python3)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(3) {
        panic!("{stderr}");
    }
    if !out.status.success() {
        return Err(stderr.into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "helm.py {action} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The chart (or a copy of it) as a path argument.
fn chart_arg(chart: &Path) -> String {
    chart.display().to_string()
}

fn chart() -> PathBuf {
    root().join("deploy/helm/snapdrain")
}

/// The chart as real Helm renders it for `values` (merged over values.yaml), release `snapdrain` in
/// namespace `snapdrain`: the release's manifest and its hooks, crds/ aside. helm-sdkpy has no template
/// or dry-run action, so Helm installs the chart, without waiting, into a simulated API server of its
/// own (no world runs there) that serves the Prometheus Operator kinds; what Helm sent is what it
/// rendered. Blocking, so that plain tests can call it: its own thread and runtime.
pub fn rendered_chart(values: &Value) -> Vec<Value> {
    let values = values.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        rt.block_on(async move {
            let sim = SimCluster::start(SimConfig::default())
                .await
                .expect("the simulated API server starts");
            let dir = tempfile::tempdir().expect("temp dir");
            let kubeconfig = sim
                .write_kubeconfig(&dir.path().join("kubeconfig"))
                .expect("kubeconfig written");
            let client = kube::Client::try_from(sim.kube_config()).expect("a kube client");
            install_prometheus_operator_kinds(&client).await;
            // Velero's namespace, where the chart's Role for Velero's Secrets goes (Velero is installed).
            let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
            let velero = serde_json::from_value(json!({"metadata": {"name": "velero"}}))
                .expect("a Namespace");
            namespaces
                .create(&PostParams::default(), &velero)
                .await
                .expect("create the velero namespace");
            let release = run_helm(
                &kubeconfig,
                dir.path(),
                "render",
                &[RELEASE, &chart_arg(&chart()), &values],
            )
            .await
            .unwrap_or_else(|e| panic!("helm cannot install the chart with {values}: {e}"));
            let mut objects = manifest_objects(&release);
            for hook in release["hooks"].as_array().into_iter().flatten() {
                let text = hook["manifest"].as_str().unwrap_or_default();
                objects.extend(
                    serde_saphyr::from_multiple::<Value>(text)
                        .unwrap_or_else(|e| panic!("a hook's manifest is not YAML: {e}\n{text}"))
                        .into_iter()
                        .filter(|d| !d.is_null()),
                );
            }
            objects
        })
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// [`rendered_chart`] with the default values, rendered once per test process.
pub fn default_chart() -> &'static [Value] {
    static RENDERED: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    RENDERED.get_or_init(|| rendered_chart(&json!({})))
}

/// The objects of a release's manifest (Helm's rendering of templates/, hooks and crds/ aside).
fn manifest_objects(release: &Value) -> Vec<Value> {
    let text = release["manifest"]
        .as_str()
        .unwrap_or_else(|| panic!("the release has a manifest: {release}"));
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("the release manifest is not YAML: {e}\n{text}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// `kubectl kustomize` of a kustomization in `dir/compare` made of `resources` and `components`,
/// directories relative to `dir` (kustomize refuses absolute ones).
fn kustomize_of(dir: &Path, resources: &[&str], components: &[&str]) -> Vec<Value> {
    let list = |paths: &[&str]| {
        paths
            .iter()
            .map(|p| format!("  - ../{p}\n"))
            .collect::<String>()
    };
    let text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n{}components:\n{}",
        list(resources),
        list(components)
    );
    let k = dir.join("compare");
    std::fs::create_dir_all(&k).expect("mkdir");
    std::fs::write(k.join("kustomization.yaml"), text).expect("kustomization written");
    kustomize_dir(&k)
}

/// The Prometheus Operator's PrometheusRule and ServiceMonitor kinds (group monitoring.coreos.com, v1,
/// namespaced; prometheus-operator `example/prometheus-operator-crd/`), with an open schema: what the
/// chart's monitoring objects need to be accepted.
async fn install_prometheus_operator_kinds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (kind, plural) in [
        ("PrometheusRule", "prometheusrules"),
        ("ServiceMonitor", "servicemonitors"),
    ] {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
            "spec": {
                "group": "monitoring.coreos.com",
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(),
                    "listKind": format!("{kind}List")},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}]
            }
        }))
        .expect("CRD JSON");
        crds.create(&PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("create the {kind} CRD: {e}"));
    }
}

/// Reads `obj` back from the cluster: Helm created it.
async fn get_live(client: &kube::Client, obj: &Value) -> DynamicObject {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let (group, version) = match s("/apiVersion").split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), s("/apiVersion").to_string()),
    };
    let kind = s("/kind");
    let gvk = kube::api::GroupVersionKind::gvk(&group, &version, kind);
    let (ar, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("the cluster serves {kind}: {e}"));
    let api: Api<DynamicObject> = match s("/metadata/namespace") {
        "" => Api::all_with(client.clone(), &ar),
        ns => Api::namespaced_with(client.clone(), ns, &ar),
    };
    api.get(s("/metadata/name"))
        .await
        .unwrap_or_else(|e| panic!("{kind} {} is in the cluster: {e}", s("/metadata/name")))
}

fn assert_same_objects(kustomized: &[Value], chart: &[Value], what: &str) {
    let kustomized = normalized_objects(kustomized);
    let chart = normalized_objects(chart);
    let only = |a: &BTreeMap<_, Value>, b: &BTreeMap<_, Value>| -> Vec<_> {
        a.keys().filter(|k| !b.contains_key(*k)).cloned().collect()
    };
    assert_eq!(
        (only(&kustomized, &chart), only(&chart, &kustomized)),
        (vec![], vec![]),
        "{what}: objects only in the kustomize tree, only in the chart"
    );
    for (k, want) in &chart {
        assert_eq!(
            &kustomized[k], want,
            "{what}: {k:?}: the kustomize tree (left) and the chart (right) differ"
        );
    }
}

/// The kustomize tree's objects that a Helm release has no counterpart for: the CRDs (the chart
/// installs its crds/, checked identical to the base's copies in kustomize.rs) and the Namespace (Helm's
/// `--create-namespace`; the base ships it labelled for Pod Security).
fn without_crds_and_namespace(objs: Vec<Value>) -> Vec<Value> {
    objs.into_iter()
        .filter(|o| o["kind"] != "CustomResourceDefinition" && o["kind"] != "Namespace")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_lints_the_chart_with_no_warning() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Lint reads no cluster; the kubeconfig only has to exist.
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").expect("kubeconfig");
    let lint = run_helm(&kubeconfig, dir.path(), "lint", &[&chart_arg(&chart())])
        .await
        .unwrap_or_else(|e| panic!("helm lint fails: {e}"));
    assert_eq!(lint["TotalChartsLinted"], 1, "{lint}");
    assert!(lint["Errors"].is_null(), "{lint}");
    // Severities: helm pkg/chart/v2/lint/support (1 info, 2 warning, 3 error). The one info is
    // Chart.yaml's "icon is recommended" (rules/chartfile.go validateChartIconPresence, the only info
    // rule there): snapdrain has no icon.
    let messages = lint["Messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        messages
            .iter()
            .map(|m| (m["Severity"].as_i64(), m["Path"].as_str()))
            .collect::<Vec<_>>(),
        vec![(Some(1), Some("Chart.yaml"))],
        "{lint}"
    );
}

/// Install with the default values, then upgrade to a pinned image with the PrometheusRule, the
/// dashboard and the ServiceMonitor on: each time Helm waits until the Deployment is available, and what
/// it installed is what the kustomize tree installs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_installs_and_upgrades_what_the_kustomize_tree_installs() {
    let c = Cluster::start().await;
    let client = c.client();
    // A copy of the chart and the kustomize tree, for pin.sh to edit.
    let deploy = root().join("deploy");
    let copy = c.dir.path().join("repo/deploy");
    for part in ["helm", "kustomize", "image"] {
        copy_tree(&deploy.join(part), &copy.join(part));
    }

    let installed = c
        .helm("install", &[RELEASE, &chart_arg(&chart()), "{}"])
        .await
        .unwrap_or_else(|e| panic!("helm install fails: {e}"));
    assert_eq!(installed["version"], 1, "the first revision");
    assert_eq!(
        installed["info"]["status"], "deployed",
        "{}",
        installed["info"]
    );
    let objects = manifest_objects(&installed);
    for o in &objects {
        get_live(&client, o).await;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d = deployments.get(RELEASE).await.expect("the Deployment");
    assert_eq!(
        d.status.and_then(|s| s.available_replicas),
        Some(2),
        "helm waited for both replicas"
    );
    let kustomized = without_crds_and_namespace(kustomize_of(
        c.dir.path(),
        &["repo/deploy/kustomize/base", "repo/deploy/kustomize/policy"],
        &[],
    ));
    assert_same_objects(&kustomized, &objects, "default install");

    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let pin = std::process::Command::new(copy.join("image/pin.sh"))
        .args(["registry.example.com/platform/snapdrain", &digest])
        .output()
        .expect("pin.sh runs");
    assert!(pin.status.success(), "pin.sh: {pin:?}");

    install_prometheus_operator_kinds(&client).await;
    let values = json!({
        "monitoring": {"prometheusRule": {"enabled": true}, "dashboard": {"enabled": true}},
        "metrics": {"serviceMonitor": {"enabled": true}}
    });
    let upgraded = c
        .helm(
            "upgrade",
            &[
                RELEASE,
                &chart_arg(&copy.join("helm/snapdrain")),
                &values.to_string(),
            ],
        )
        .await
        .unwrap_or_else(|e| panic!("helm upgrade fails: {e}"));
    assert_eq!(upgraded["version"], 2, "the second revision");
    assert_eq!(
        upgraded["info"]["status"], "deployed",
        "{}",
        upgraded["info"]
    );
    let objects = manifest_objects(&upgraded);
    for o in &objects {
        get_live(&client, o).await;
    }
    let pinned = format!("registry.example.com/platform/snapdrain:0.1.0@{digest}");
    let d = deployments.get(RELEASE).await.expect("the Deployment");
    let spec = d.spec.expect("a spec").template.spec.expect("a pod spec");
    assert_eq!(spec.containers[0].image.as_deref(), Some(pinned.as_str()));
    // The kustomize uninstall Job runs the same pinned image.
    let uninstall = kustomize_of(c.dir.path(), &["repo/deploy/kustomize/uninstall"], &[]);
    let job = uninstall
        .iter()
        .find(|o| o["kind"] == "Job")
        .expect("the uninstall Job");
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["image"],
        json!(pinned)
    );
    assert_eq!(
        d.status.and_then(|s| s.available_replicas),
        Some(2),
        "helm waited for the rollout of the pinned image"
    );
    let dashboard: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let data = dashboard
        .get("snapdrain-dashboard")
        .await
        .expect("the dashboard ConfigMap")
        .data
        .unwrap_or_default();
    let source = std::fs::read_to_string(deploy.join("monitoring/dashboard.json")).expect("read");
    assert!(
        data.get("snapdrain.json") == Some(&source),
        "the dashboard as committed"
    );

    let kustomized = without_crds_and_namespace(kustomize_of(
        c.dir.path(),
        &["repo/deploy/kustomize/base", "repo/deploy/kustomize/policy"],
        &[
            "repo/deploy/kustomize/components/servicemonitor",
            "repo/deploy/kustomize/components/monitoring",
        ],
    ));
    assert_same_objects(&kustomized, &objects, "pinned, with monitoring");
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir").flatten() {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}
