//! checkov's Kubernetes policies pass on what users install: the Helm chart as real Helm renders it
//! (tests/e2e/helm.rs) with its default values and with every optional object on, and the kustomize
//! base, overlays and policy, rendered by `kubectl kustomize`. Each finding snapdrain accepts is skipped in the manifest itself with a
//! `checkov.io/skipN: <check>=<reason>` annotation (checkov's Kubernetes skip syntax), so a new finding
//! fails here. checkov runs offline (`--skip-download`); .ci/run installs it (`pip install checkov`).

use std::process::Command;

use serde_json::{Value, json};

use super::helm::{default_chart, rendered_chart};
use super::kustomize::kustomize;

/// Runs checkov on `docs` written as one multi-document YAML file; returns its report when it fails.
fn checkov(name: &str, docs: &[Value]) -> Option<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join(format!("{name}.yaml"));
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string(d).expect("JSON is YAML"))
        .collect();
    std::fs::write(&file, text.join("\n---\n")).expect("write the manifests");
    let out = Command::new("checkov")
        .args([
            "--framework",
            "kubernetes",
            "--skip-download",
            "--compact",
            "--quiet",
            "-f",
        ])
        .arg(&file)
        .output()
        .expect("checkov runs: install it with `pip install checkov` (.ci/run does)");
    (!out.status.success()).then(|| {
        format!(
            "{name}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn checkov_passes_on_the_chart_and_the_kustomize_manifests() {
    let everything_on = json!({
        "networkPolicy": {"enabled": true,
                          "webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/28"}}],
                          "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]},
        "metrics": {"serviceMonitor": {"enabled": true}},
    });
    let sets = [
        ("chart-defaults", default_chart().to_vec()),
        ("chart-all-on", rendered_chart(&everything_on)),
        ("kustomize-base", kustomize("deploy/kustomize/base")),
        (
            "kustomize-irsa",
            kustomize("deploy/kustomize/overlays/irsa"),
        ),
        ("kustomize-policy", kustomize("deploy/kustomize/policy")),
        (
            "kustomize-uninstall",
            kustomize("deploy/kustomize/uninstall"),
        ),
    ];
    let failures: Vec<String> = sets
        .iter()
        .filter_map(|(name, docs)| {
            assert!(!docs.is_empty(), "{name} renders nothing");
            checkov(name, docs)
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
