//! The kustomize base (deploy/kustomize) and the Helm chart install the same thing: the base rendered
//! by the real `kubectl kustomize`, the chart by `helm_render` with its default values (release
//! `snapdrain` in namespace `snapdrain`), compared object by object; only the labels each tool adds
//! differ. Also: the base's CRDs are the committed ones, the pod is what Pod Security's `restricted`
//! profile admits, and the IRSA overlay renders.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

use super::helm_render::{Release, render_chart};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `kubectl kustomize <dir>` (kubectl embeds kustomize), parsed.
pub fn kustomize(dir: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join(dir))
        .output()
        .expect("kubectl runs: install kubectl (it embeds kustomize)");
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("kubectl kustomize {dir} is not YAML: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

type Key = (String, String, String);

fn key(o: &Value) -> Key {
    let s = |p: &str| {
        o.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (s("/kind"), s("/metadata/namespace"), s("/metadata/name"))
}

/// The object without what differs by tool: labels other than the selector labels.
fn normalized(o: &Value) -> Value {
    let mut o = o.clone();
    let keep = |labels: &mut Value| {
        if let Some(m) = labels.as_object_mut() {
            m.retain(|k, _| k == "app.kubernetes.io/name" || k == "app.kubernetes.io/instance");
        }
    };
    if let Some(l) = o.pointer_mut("/metadata/labels") {
        keep(l);
    }
    // kustomize puts the selector labels on the pod template as well; so does the chart.
    if let Some(l) = o.pointer_mut("/spec/template/metadata/labels") {
        keep(l);
    }
    o
}

fn by_key(objs: Vec<Value>) -> BTreeMap<Key, Value> {
    objs.into_iter()
        .map(|o| (key(&o), normalized(&o)))
        .collect()
}

fn default_release() -> Release<'static> {
    Release {
        name: "snapdrain",
        namespace: "snapdrain",
    }
}

fn chart_dir() -> PathBuf {
    root().join("deploy/helm/snapdrain")
}

#[test]
fn the_kustomize_crds_are_the_committed_crds() {
    for file in ["disruptionplan.yaml", "disruptionpolicy.yaml"] {
        let committed = std::fs::read_to_string(root().join("crds").join(file)).expect("crds/");
        let copy = std::fs::read_to_string(root().join("deploy/kustomize/base/crds").join(file))
            .expect("deploy/kustomize/base/crds/");
        assert!(
            committed == copy,
            "deploy/kustomize/base/crds/{file} differs from crds/{file}: cp crds/{file} deploy/kustomize/base/crds/"
        );
    }
}

#[test]
fn kustomize_and_the_chart_install_the_same_objects() {
    let mut kustomized = by_key(kustomize("deploy/kustomize/base"));
    // The chart installs its CRDs from crds/ (checked identical in deploy.rs and above).
    kustomized.retain(|(kind, _, _), _| kind != "CustomResourceDefinition");
    // The chart creates the Namespace with `--create-namespace`; the base ships it labelled for Pod
    // Security.
    kustomized
        .remove(&("Namespace".into(), String::new(), "snapdrain".into()))
        .expect("the base ships the Namespace");
    kustomized.extend(by_key(kustomize("deploy/kustomize/policy")));
    let mut chart = by_key(render_chart(&chart_dir(), &json!({}), &default_release()));
    // Helm hooks (the pre-delete uninstall Job and its RBAC) have no kustomize counterpart: a kustomize
    // user runs `snapdrain holds release --all` before `kubectl delete -k` (README, "Uninstall").
    chart.retain(|_, obj| obj.pointer("/metadata/annotations/helm.sh~1hook").is_none());
    let only = |a: &BTreeMap<Key, Value>, b: &BTreeMap<Key, Value>| -> Vec<Key> {
        a.keys().filter(|k| !b.contains_key(*k)).cloned().collect()
    };
    assert_eq!(
        (only(&kustomized, &chart), only(&chart, &kustomized)),
        (vec![], vec![]),
        "objects only in the kustomize base, only in the chart"
    );
    for (k, want) in &chart {
        assert_eq!(
            &kustomized[k], want,
            "{k:?}: the kustomize base (left) and the chart (right) differ"
        );
    }
}

#[test]
fn the_pod_is_what_the_restricted_pod_security_profile_admits() {
    let base = kustomize("deploy/kustomize/base");
    let ns = base
        .iter()
        .find(|o| o["kind"] == "Namespace")
        .expect("a Namespace");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let deployment = base
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    // kubernetes `staging/src/k8s.io/pod-security-admission/policy/check_*.go` (restricted):
    // runAsNonRoot, seccomp RuntimeDefault or Localhost, no privilege escalation, drop ALL.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["requests"]["memory"].is_string());
    let spread = pod["topologySpreadConstraints"]
        .as_array()
        .expect("topology spread");
    assert!(
        spread
            .iter()
            .any(|t| t["topologyKey"] == "kubernetes.io/hostname"
                && t["whenUnsatisfiable"] == "DoNotSchedule"),
        "one replica per node: {spread:?}"
    );
    let pdb = base
        .iter()
        .find(|o| o["kind"] == "PodDisruptionBudget")
        .expect("a PDB");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let quota = base
        .iter()
        .find(|o| o["kind"] == "ResourceQuota")
        .expect("the critical-pods quota");
    assert_eq!(
        quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"],
        json!(["system-cluster-critical"])
    );
}

#[test]
fn the_irsa_overlay_annotates_the_service_account_and_adds_the_service_monitor() {
    let overlay = kustomize("deploy/kustomize/overlays/irsa");
    let sa = overlay
        .iter()
        .find(|o| o["kind"] == "ServiceAccount")
        .expect("the ServiceAccount");
    let arn = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
        .as_str()
        .expect("the IRSA annotation");
    assert!(arn.starts_with("arn:aws:iam::"), "{arn}");
    let deployment = overlay
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the Deployment");
    let c = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["name"] == "AWS_REGION")
    );
    assert_ne!(c["image"], "snapdrain:0.1.0", "the overlay sets the image");
    let monitor = overlay
        .iter()
        .find(|o| o["kind"] == "ServiceMonitor")
        .expect("the ServiceMonitor component");
    let chart = render_chart(
        &chart_dir(),
        &json!({"metrics": {"serviceMonitor": {"enabled": true}}}),
        &default_release(),
    );
    let chart_monitor = chart
        .iter()
        .find(|o| o["kind"] == "ServiceMonitor")
        .expect("the chart's ServiceMonitor");
    assert_eq!(normalized(monitor), normalized(chart_monitor));
}
