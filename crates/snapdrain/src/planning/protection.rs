//! Which pods a DisruptionPolicy protects: the default rule (StatefulSet pods with a PVC) narrowed by the
//! policy's pod and namespace selectors.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::core::{Selector, SelectorExt};

use super::inventory::ProtectionRule;
use crate::api::policy::ProtectionSpec;

/// True when `pod` (in a namespace with `namespace_labels`) is protected under `spec`. A selector that
/// cannot be parsed protects nothing extra away: it is ignored here and reported by policy validation.
pub fn protects(
    spec: &ProtectionSpec,
    pod: &Pod,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> bool {
    if !ProtectionRule::default().protects(pod) {
        return false;
    }
    let empty = BTreeMap::new();
    let matches = |sel: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
                   labels: &BTreeMap<String, String>| {
        sel.as_ref()
            .is_none_or(|s| Selector::try_from(s.clone()).map_or(true, |sel| sel.matches(labels)))
    };
    matches(
        &spec.pod_selector,
        pod.metadata.labels.as_ref().unwrap_or(&empty),
    ) && matches(&spec.namespace_selector, namespace_labels.unwrap_or(&empty))
}

/// As [`protects`], for a namespace whose labels may not be known yet (not in the cache): without them
/// the namespace selector is left out, so the pod is protected more, never less. Planning and the gate
/// judge with it; the hold keeper waits for the labels instead.
pub fn protects_or_more(
    spec: &ProtectionSpec,
    pod: &Pod,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> bool {
    match namespace_labels {
        Some(labels) => protects(spec, pod, Some(labels)),
        None => protects(
            &ProtectionSpec {
                namespace_selector: None,
                ..spec.clone()
            },
            pod,
            None,
        ),
    }
}

/// The default rule alone (StatefulSet pods with a PVC), for callers without a policy (tests, benches).
pub fn default_rule(pod: &Pod) -> bool {
    ProtectionRule::default().protects(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "db-0", "namespace": "shop", "labels": labels,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                     "uid": "s1", "controller": true}]},
            "spec": {"containers": [], "volumes": [{"name": "data",
                "persistentVolumeClaim": {"claimName": "data-db-0"}}]},
            "status": {"phase": "Running"}
        }))
        .expect("a test pod")
    }

    #[test]
    fn selectors_narrow_the_default_rule() {
        let all = ProtectionSpec::default();
        assert!(protects(&all, &pod(json!({})), None));
        let tier: ProtectionSpec = serde_json::from_value(json!({
            "podSelector": {"matchLabels": {"tier": "data"}},
            "namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["scratch"]}]}
        }))
        .expect("valid");
        assert!(!protects(&tier, &pod(json!({})), None));
        let labels: BTreeMap<String, String> = [("env".into(), "prod".into())].into();
        assert!(protects(
            &tier,
            &pod(json!({"tier": "data"})),
            Some(&labels)
        ));
        let scratch: BTreeMap<String, String> = [("env".into(), "scratch".into())].into();
        assert!(!protects(
            &tier,
            &pod(json!({"tier": "data"})),
            Some(&scratch)
        ));
        let mut no_pvc = pod(json!({}));
        no_pvc.spec.as_mut().expect("spec").volumes = None;
        assert!(!protects(&all, &no_pvc, None));
    }
}
