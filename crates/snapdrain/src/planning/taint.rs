//! snapdrain's own drain taint and toleration matching, as pure functions.
//!
//! A cordon alone does not keep pods off a node: the DaemonSet controller gives every DaemonSet pod a
//! toleration for `node.kubernetes.io/unschedulable:NoSchedule` (kubernetes
//! `pkg/controller/daemon/util/daemonset_util.go` `AddOrUpdateDaemonPodTolerations`), and a pod with
//! `tolerations: [{operator: Exists}]` tolerates everything. Karpenter taints a node it drains with its own
//! `karpenter.sh/disrupted:NoSchedule` and never evicts pods that tolerate it (kubernetes-sigs/karpenter
//! `pkg/utils/pod/scheduling.go` `IsEvictable` / `ToleratesDisruptedNoScheduleTaint`): such a pod would
//! come straight back. snapdrain does the same with [`DRAIN_TAINT_KEY`].

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

/// The key of the NoSchedule taint snapdrain puts on a node it drains (as well as cordoning it).
pub const DRAIN_TAINT_KEY: &str = "snapdrain.io/draining";
/// The taint's effect: nothing new is scheduled; running pods stay until evicted.
pub const DRAIN_TAINT_EFFECT: &str = "NoSchedule";

/// snapdrain's drain taint (no value, like Karpenter's).
pub fn drain_taint() -> Taint {
    Taint {
        key: DRAIN_TAINT_KEY.to_owned(),
        effect: DRAIN_TAINT_EFFECT.to_owned(),
        value: None,
        time_added: None,
    }
}

/// `Toleration.ToleratesTaint` of k8s.io/api core/v1 `toleration.go`: the effect must match (or be empty),
/// an empty key with `Exists` tolerates every taint, `Exists` ignores the value, `Equal` (the default)
/// compares it.
pub fn toleration_tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            // An empty key is only valid with Exists; with Equal it tolerates nothing.
            !key.is_empty()
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// True when the pod tolerates snapdrain's drain taint: it would be scheduled straight back onto the
/// node, so it is never evicted (Karpenter's rule for its own taint).
pub fn tolerates_drain_taint(pod: &Pod) -> bool {
    let taint = drain_taint();
    pod.spec
        .iter()
        .flat_map(|s| s.tolerations.iter().flatten())
        .any(|t| toleration_tolerates(t, &taint))
}

/// True when `taints` hold snapdrain's drain taint (any value, same effect).
pub fn has_drain_taint(taints: &[Taint]) -> bool {
    taints
        .iter()
        .any(|t| t.key == DRAIN_TAINT_KEY && t.effect == DRAIN_TAINT_EFFECT)
}

/// The node's taints with the drain taint added, or None when it is already there.
pub fn with_drain_taint(taints: &[Taint]) -> Option<Vec<Taint>> {
    if has_drain_taint(taints) {
        return None;
    }
    let mut out = taints.to_vec();
    out.push(drain_taint());
    Some(out)
}

/// The node's taints without the drain taint, or None when it is not there. Other taints (the node
/// lifecycle controller's, Karpenter's, a person's) are kept as they are.
pub fn without_drain_taint(taints: &[Taint]) -> Option<Vec<Taint>> {
    if !has_drain_taint(taints) {
        return None;
    }
    Some(
        taints
            .iter()
            .filter(|t| !(t.key == DRAIN_TAINT_KEY && t.effect == DRAIN_TAINT_EFFECT))
            .cloned()
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tol(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).expect("toleration")
    }

    fn pod_with(tolerations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}], "tolerations": tolerations}
        }))
        .expect("pod")
    }

    #[test]
    fn toleration_matching_follows_core_v1() {
        let t = drain_taint();
        assert!(toleration_tolerates(
            &tol(json!({"operator": "Exists"})),
            &t
        ));
        assert!(toleration_tolerates(
            &tol(json!({"key": DRAIN_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})),
            &t
        ));
        assert!(toleration_tolerates(
            &tol(json!({"key": DRAIN_TAINT_KEY, "operator": "Equal", "value": ""})),
            &t
        ));
        assert!(!toleration_tolerates(
            &tol(json!({"key": DRAIN_TAINT_KEY, "operator": "Equal", "value": "x"})),
            &t
        ));
        assert!(!toleration_tolerates(
            &tol(json!({"operator": "Exists", "effect": "NoExecute"})),
            &t
        ));
        assert!(!toleration_tolerates(
            &tol(json!({"operator": "Equal"})),
            &t
        ));
        // What the DaemonSet controller adds does not cover snapdrain's taint.
        assert!(!toleration_tolerates(
            &tol(
                json!({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"})
            ),
            &t
        ));
    }

    #[test]
    fn pods_tolerating_everything_tolerate_the_drain_taint() {
        assert!(tolerates_drain_taint(&pod_with(
            json!([{"operator": "Exists"}])
        )));
        assert!(!tolerates_drain_taint(&pod_with(json!([
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ]))));
        assert!(!tolerates_drain_taint(&pod_with(json!([]))));
    }

    #[test]
    fn adding_and_removing_keep_other_taints() {
        let other: Taint = serde_json::from_value(
            json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}),
        )
        .expect("taint");
        let added = with_drain_taint(std::slice::from_ref(&other)).expect("added");
        assert_eq!(added.len(), 2);
        assert!(has_drain_taint(&added));
        assert_eq!(with_drain_taint(&added), None, "idempotent");
        let removed = without_drain_taint(&added).expect("removed");
        assert_eq!(removed, vec![other.clone()]);
        assert_eq!(without_drain_taint(&removed), None);
    }
}
