//! The kustomize tree (deploy/kustomize) rendered by the real `kubectl kustomize`: the base's CRDs are
//! the committed ones, the pod is what Pod Security's `restricted` profile admits, and the IRSA overlay
//! renders. tests/e2e/helm.rs compares it with what Helm installs from the chart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `kubectl kustomize <dir>` (kubectl embeds kustomize) of a directory of the repository, parsed.
pub fn kustomize(dir: &str) -> Vec<Value> {
    kustomize_dir(&root().join(dir))
}

/// `kubectl kustomize <dir>`, parsed.
pub fn kustomize_dir(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl runs: install kubectl (it embeds kustomize)");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("kubectl kustomize {} is not YAML: {e}", dir.display()))
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

/// The object without the labels only one tool adds: Helm's `app.kubernetes.io/version`,
/// `app.kubernetes.io/managed-by: Helm` and `helm.sh/chart`, kustomize's `managed-by: kustomize`.
fn normalized(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(m) = o
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        for tool_label in [
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ] {
            m.remove(tool_label);
        }
    }
    o
}

/// Objects by (kind, namespace, name), normalized for comparison across tools.
pub fn normalized_objects(objs: &[Value]) -> BTreeMap<Key, Value> {
    objs.iter().map(|o| (key(o), normalized(o))).collect()
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
fn the_irsa_overlay_annotates_the_service_account_and_adds_monitoring() {
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
    for kind in ["ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(
            overlay.iter().any(|o| o["kind"] == kind),
            "the overlay's monitoring components add a {kind}"
        );
    }
}
