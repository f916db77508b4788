//! Holds: the annotations that keep autoscalers away from a protected pod's node until its backup is
//! verified. Pure: each function returns the annotation changes (a merge patch's `metadata.annotations`,
//! `None` deleting a key) or nothing when the object is already as wanted.
//!
//! On each protected pod:
//! - `karpenter.sh/do-not-disrupt: "true"`: Karpenter's graceful methods skip the node, unless the
//!   method is eventual (Drift) and the NodeClaim has a terminationGracePeriod; its forceful termination
//!   waits for the pod until `terminationTime − pod grace` (kubernetes-sigs/karpenter
//!   `pkg/utils/pod/scheduling.go` `IsDoNotDisruptActive`, `pkg/controllers/disruption/types.go`
//!   `NewCandidate`, `pkg/controllers/node/termination/terminator/eviction.go` `needsForceDelete`).
//! - `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`, only under the policy's
//!   `holds.clusterAutoscaler: SafeToEvictFalse`: Cluster Autoscaler does not scale the node down, ever
//!   (kubernetes/autoscaler `simulator/drainability/rules/notsafetoevict/rule.go` blocks the node, so it
//!   is never unneeded and never tainted, and no CA signal fires). Under the default (`Gate`) the pod
//!   carries no CA annotation: CA may pick the node, its `DeletionCandidateOfClusterAutoscaler` taint
//!   starts the backup, and its drain waits at the eviction gate. [`place`] takes snapdrain's own
//!   `safe-to-evict` off a pod when the policy no longer wants it.
//!
//! On the Node that runs such a pod, `karpenter.sh/do-not-disrupt: "true"` too. Drift is Karpenter's
//! eventual disruption: with a NodePool `terminationGracePeriod`, `NewCandidate` ignores pod-level
//! do-not-disrupt and PDBs, and the NodeClaim is deleted with the pods still held; Karpenter then
//! DELETEs each pod at `terminationTime − pod grace` (no eviction, so no PDB and no gate). The Node's own
//! annotation is checked first, in `ValidateNodeDisruptable` (`pkg/controllers/state/statenode.go`), and
//! is never ignored, so only it keeps drift away until the backup is verified. It blocks the graceful and
//! eventual methods, not a forceful deletion (expiry, a NodeClaim deleted by hand, spot interruption).
//!
//! [`HELD_ANNOTATION`] lists which holds snapdrain set itself: a value a user wrote is never changed or
//! removed. A released pod carries [`RELEASED_ANNOTATION`] (the plan that released it), so the hold
//! keeper leaves it alone while that plan runs and restores the hold when the plan is over. A Node's hold
//! follows its pods ([`node_change`]): it stays while one of them is held, and goes with the last release.

use std::collections::BTreeMap;

use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::inventory::DO_NOT_DISRUPT_ANNOTATION;
use crate::api::policy::ClusterAutoscalerHold;

pub const SAFE_TO_EVICT_ANNOTATION: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// Which hold annotations snapdrain placed, comma-separated (`do-not-disrupt,safe-to-evict`).
pub const HELD_ANNOTATION: &str = "snapdrain.io/held";
/// The plan that released the pod's holds.
pub const RELEASED_ANNOTATION: &str = "snapdrain.io/released-by";

/// A hold: (annotation, the value that holds, the short name in [`HELD_ANNOTATION`]).
type Hold = (&'static str, &'static str, &'static str);

/// Every hold a pod may carry (what a release or removal takes off).
const POD_HOLDS: [Hold; 2] = [
    (DO_NOT_DISRUPT_ANNOTATION, "true", "do-not-disrupt"),
    (SAFE_TO_EVICT_ANNOTATION, "false", "safe-to-evict"),
];

/// The holds a protected pod carries under the policy's `holds.clusterAutoscaler`.
fn pod_holds(ca: ClusterAutoscalerHold) -> &'static [Hold] {
    match ca {
        ClusterAutoscalerHold::Gate => &POD_HOLDS[..1],
        ClusterAutoscalerHold::SafeToEvictFalse => &POD_HOLDS,
    }
}

/// The hold of a Velero data-path pod (`super::velero_pods`): Karpenter's only, so its termination
/// never queues the pod while its backup runs (kubernetes-sigs/karpenter `pkg/utils/pod/scheduling.go`
/// `IsEvictable`). Cluster Autoscaler keeps a node running one anyway: a pod controlled by a Velero
/// custom resource (its PodVolumeBackup or DataUpload) is not "replicated" to CA, and a hostPath volume
/// is local storage (kubernetes/autoscaler `simulator/drainability/rules/replicated`,
/// `rules/localstorage`).
const DATA_PATH_HOLDS: [Hold; 1] = [(DO_NOT_DISRUPT_ANNOTATION, "true", "do-not-disrupt")];

/// A Node's hold: Karpenter's only (`ValidateNodeDisruptable` reads it from the Node once it is
/// registered). Cluster Autoscaler reads no Node annotation of snapdrain's: its pods' hold (under
/// `SafeToEvictFalse`) or the eviction gate (under `Gate`) is what keeps it.
const NODE_HOLDS: [Hold; 1] = [(DO_NOT_DISRUPT_ANNOTATION, "true", "do-not-disrupt")];

/// Annotation changes: `Some(value)` sets, `None` deletes.
pub type AnnotationPatch = BTreeMap<String, Option<String>>;

type Annotations = BTreeMap<String, String>;

/// How a pod (or Node) stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldState {
    /// No hold of snapdrain's (there may be a user's own annotations).
    Unheld,
    /// snapdrain placed these (short names).
    Held(Vec<String>),
    /// Released by this plan.
    Released(String),
}

fn get<'a>(a: Option<&'a Annotations>, key: &str) -> Option<&'a str> {
    a.and_then(|a| a.get(key)).map(String::as_str)
}

fn ours(a: Option<&Annotations>) -> Vec<String> {
    get(a, HELD_ANNOTATION)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn annotations_of(pod: &Pod) -> Option<&Annotations> {
    pod.metadata.annotations.as_ref()
}

fn state_of(a: Option<&Annotations>) -> HoldState {
    if let Some(plan) = get(a, RELEASED_ANNOTATION) {
        return HoldState::Released(plan.to_owned());
    }
    let ours = ours(a);
    if ours.is_empty() {
        HoldState::Unheld
    } else {
        HoldState::Held(ours)
    }
}

pub fn state(pod: &Pod) -> HoldState {
    state_of(annotations_of(pod))
}

/// True when the pod's active `do-not-disrupt` is snapdrain's own hold (it stands for "not before the
/// backup is verified", which a plan's drain checks itself), not a user's.
pub fn own_do_not_disrupt(pod: &Pod) -> bool {
    let a = annotations_of(pod);
    get(a, DO_NOT_DISRUPT_ANNOTATION) == Some("true")
        && ours(a).iter().any(|m| m == "do-not-disrupt")
}

/// Places the `wanted` holds that are missing and takes off snapdrain's own of the `known` ones no
/// longer wanted (only where the value is still the one it wrote; the mark goes either way).
fn place_on(a: Option<&Annotations>, wanted: &[Hold], known: &[Hold]) -> Option<AnnotationPatch> {
    if get(a, RELEASED_ANNOTATION).is_some() {
        return None;
    }
    let before = ours(a);
    let mut mine = before.clone();
    let mut patch = AnnotationPatch::new();
    for (key, value, short) in known.iter().filter(|h| !wanted.contains(h)) {
        if mine.iter().any(|m| m == short) {
            if get(a, key) == Some(*value) {
                patch.insert((*key).to_owned(), None);
            }
            mine.retain(|m| m != short);
        }
    }
    for (key, value, short) in wanted {
        let owned = mine.iter().any(|m| m == short);
        match get(a, key) {
            // Ours and in place, or a user's own value: nothing to do.
            Some(_) => {}
            // Ours but removed by someone (or never written): put it back.
            None => {
                patch.insert((*key).to_owned(), Some((*value).to_owned()));
                if !owned {
                    mine.push((*short).to_owned());
                }
            }
        }
    }
    if patch.is_empty() && mine == before {
        return None;
    }
    let mark = (!mine.is_empty()).then(|| mine.join(","));
    patch.insert(HELD_ANNOTATION.to_owned(), mark);
    Some(patch)
}

/// Places the holds snapdrain may place under `ca` (the policy's `holds.clusterAutoscaler`): each hold
/// annotation the pod does not carry yet, and takes off a `safe-to-evict` of snapdrain's that `ca` no
/// longer wants. A released pod is left alone (see [`restore`]).
pub fn place(pod: &Pod, ca: ClusterAutoscalerHold) -> Option<AnnotationPatch> {
    place_on(annotations_of(pod), pod_holds(ca), &POD_HOLDS)
}

/// Places the hold of a running Velero data-path pod (ownership-marked like the others; a user's own
/// `do-not-disrupt`, e.g. from the node-agent ConfigMap's `podAnnotations`, is left as it is). The pod
/// is deleted by Velero when its backup ends, so the hold is never taken off.
pub fn place_data_path(pod: &Pod) -> Option<AnnotationPatch> {
    place_on(annotations_of(pod), &DATA_PATH_HOLDS, &DATA_PATH_HOLDS)
}

/// Removes the holds snapdrain placed (only where the value is still the one it wrote) and marks the
/// pod released by `plan`.
pub fn release(pod: &Pod, plan: &str) -> Option<AnnotationPatch> {
    let a = annotations_of(pod);
    if get(a, RELEASED_ANNOTATION) == Some(plan) && ours(a).is_empty() {
        return None;
    }
    let mut patch = remove_ours(a, &POD_HOLDS);
    patch.insert(HELD_ANNOTATION.to_owned(), None);
    patch.insert(RELEASED_ANNOTATION.to_owned(), Some(plan.to_owned()));
    Some(patch)
}

/// Takes away the release mark and puts back the holds `ca` wants.
pub fn restore(pod: &Pod, ca: ClusterAutoscalerHold) -> Option<AnnotationPatch> {
    let a = annotations_of(pod);
    get(a, RELEASED_ANNOTATION)?;
    let mut unmarked = a.cloned().unwrap_or_default();
    unmarked.remove(RELEASED_ANNOTATION);
    let mut patch = place_on(Some(&unmarked), pod_holds(ca), &POD_HOLDS).unwrap_or_default();
    patch.insert(RELEASED_ANNOTATION.to_owned(), None);
    Some(patch)
}

fn remove_on(a: Option<&Annotations>, holds: &[Hold]) -> Option<AnnotationPatch> {
    let marked = get(a, HELD_ANNOTATION).is_some() || get(a, RELEASED_ANNOTATION).is_some();
    if !marked {
        return None;
    }
    let mut patch = remove_ours(a, holds);
    patch.insert(HELD_ANNOTATION.to_owned(), None);
    patch.insert(RELEASED_ANNOTATION.to_owned(), None);
    Some(patch)
}

/// Removes every trace of snapdrain's holds (a pod no longer protected, or `snapdrain holds release`).
pub fn remove(pod: &Pod) -> Option<AnnotationPatch> {
    remove_on(annotations_of(pod), &POD_HOLDS)
}

fn remove_ours(a: Option<&Annotations>, holds: &[Hold]) -> AnnotationPatch {
    let mine = ours(a);
    holds
        .iter()
        .filter(|(key, value, short)| {
            mine.iter().any(|m| m == short) && get(a, key) == Some(*value)
        })
        .map(|(key, _, _)| (key.to_string(), None))
        .collect()
}

fn node_annotations(node: &Node) -> Option<&Annotations> {
    node.metadata.annotations.as_ref()
}

/// How a Node stands: `Held` while snapdrain's `do-not-disrupt` is on it.
pub fn node_state(node: &Node) -> HoldState {
    state_of(node_annotations(node))
}

/// The change that brings a Node's hold where its pods want it: `needed` when the node runs a protected
/// pod whose hold no plan has released (no verified backup lets it go yet). Placed when needed and
/// missing (a user's own value stays as it is); removed, only where snapdrain placed it, when not.
/// Returns what is done ("placed", "removed") and the patch.
pub fn node_change(node: &Node, needed: bool) -> Option<(&'static str, AnnotationPatch)> {
    let a = node_annotations(node);
    if needed {
        place_on(a, &NODE_HOLDS, &NODE_HOLDS).map(|p| ("placed", p))
    } else {
        remove_on(a, &NODE_HOLDS).map(|p| ("removed", p))
    }
}

/// Removes every trace of snapdrain's hold from a Node (`snapdrain holds release`).
pub fn remove_from_node(node: &Node) -> Option<AnnotationPatch> {
    remove_on(node_annotations(node), &NODE_HOLDS)
}

/// The `metadata` of a JSON merge patch applying `patch`, guarded by the object's resourceVersion so a
/// concurrent change (a user's own annotation) makes it fail with 409 instead of being overwritten.
pub fn merge_patch<K: Metadata<Ty = ObjectMeta>>(
    obj: &K,
    patch: &AnnotationPatch,
) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "resourceVersion": obj.metadata().resource_version,
            "annotations": patch,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy setting under which pods carry both holds.
    const BLOCK: ClusterAutoscalerHold = ClusterAutoscalerHold::SafeToEvictFalse;
    const GATE: ClusterAutoscalerHold = ClusterAutoscalerHold::Gate;

    #[test]
    fn under_the_gate_setting_a_pod_gets_do_not_disrupt_alone_and_loses_snapdrains_safe_to_evict() {
        let p = apply(
            &pod(&[]),
            &place(&pod(&[]), GATE).expect("a new pod is held"),
        );
        assert_eq!(ann(&p, DO_NOT_DISRUPT_ANNOTATION), Some("true"));
        assert_eq!(ann(&p, SAFE_TO_EVICT_ANNOTATION), None);
        assert_eq!(state(&p), HoldState::Held(vec!["do-not-disrupt".into()]));
        assert_eq!(place(&p, GATE), None, "placing twice changes nothing");
        // Held under SafeToEvictFalse, then the policy changes: snapdrain's own CA hold goes.
        let both = apply(&pod(&[]), &place(&pod(&[]), BLOCK).expect("held"));
        let now = apply(&both, &place(&both, GATE).expect("the CA hold goes"));
        assert_eq!(ann(&now, SAFE_TO_EVICT_ANNOTATION), None);
        assert_eq!(state(&now), HoldState::Held(vec!["do-not-disrupt".into()]));
        assert_eq!(place(&now, GATE), None);
        // A user's own safe-to-evict stays, whatever it says.
        let users = pod(&[(SAFE_TO_EVICT_ANNOTATION, "false")]);
        let held = apply(
            &users,
            &place(&users, GATE).expect("do-not-disrupt is missing"),
        );
        assert_eq!(ann(&held, SAFE_TO_EVICT_ANNOTATION), Some("false"));
        assert_eq!(place(&held, GATE), None);
        // Restoring after a release puts back only what the setting wants.
        let released = apply(&both, &release(&both, "p").expect("released"));
        let back = apply(&released, &restore(&released, GATE).expect("restored"));
        assert_eq!(ann(&back, SAFE_TO_EVICT_ANNOTATION), None);
        assert_eq!(state(&back), HoldState::Held(vec!["do-not-disrupt".into()]));
    }

    #[test]
    fn a_data_path_pod_gets_do_not_disrupt_alone_and_a_users_own_stays() {
        let patch = place_data_path(&pod(&[])).expect("an unheld pod gets the hold");
        assert_eq!(
            patch,
            AnnotationPatch::from([
                (
                    DO_NOT_DISRUPT_ANNOTATION.to_owned(),
                    Some("true".to_owned())
                ),
                (
                    HELD_ANNOTATION.to_owned(),
                    Some("do-not-disrupt".to_owned())
                ),
            ])
        );
        assert_eq!(place_data_path(&apply(&pod(&[]), &patch)), None);
        // The node-agent ConfigMap's podAnnotations already hold it: not snapdrain's to mark.
        assert_eq!(
            place_data_path(&pod(&[(DO_NOT_DISRUPT_ANNOTATION, "true")])),
            None
        );
    }

    fn pod(annotations: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    fn apply(p: &Pod, patch: &AnnotationPatch) -> Pod {
        let mut out = p.clone();
        let a = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in patch {
            match v {
                Some(v) => a.insert(k.clone(), v.clone()),
                None => a.remove(k),
            };
        }
        out
    }

    fn ann<'a>(p: &'a Pod, k: &str) -> Option<&'a str> {
        get(annotations_of(p), k)
    }

    #[test]
    fn a_new_pod_gets_both_holds_marked_as_snapdrains() {
        let p = apply(
            &pod(&[]),
            &place(&pod(&[]), BLOCK).expect("a new pod is held"),
        );
        assert_eq!(ann(&p, DO_NOT_DISRUPT_ANNOTATION), Some("true"));
        assert_eq!(ann(&p, SAFE_TO_EVICT_ANNOTATION), Some("false"));
        assert_eq!(
            state(&p),
            HoldState::Held(vec!["do-not-disrupt".into(), "safe-to-evict".into()])
        );
        assert_eq!(place(&p, BLOCK), None, "placing twice changes nothing");
        assert!(own_do_not_disrupt(&p));
        assert!(!own_do_not_disrupt(&pod(&[(
            DO_NOT_DISRUPT_ANNOTATION,
            "true"
        )])));
    }

    #[test]
    fn a_users_own_annotation_is_never_touched() {
        let user = pod(&[(DO_NOT_DISRUPT_ANNOTATION, "true")]);
        let held = apply(
            &user,
            &place(&user, BLOCK).expect("safe-to-evict is still missing"),
        );
        assert_eq!(state(&held), HoldState::Held(vec!["safe-to-evict".into()]));
        let released = apply(&held, &release(&held, "p1").expect("release"));
        assert_eq!(
            ann(&released, DO_NOT_DISRUPT_ANNOTATION),
            Some("true"),
            "the user's stays"
        );
        assert_eq!(ann(&released, SAFE_TO_EVICT_ANNOTATION), None);
        let removed = apply(&released, &remove(&released).expect("marked"));
        assert_eq!(ann(&removed, DO_NOT_DISRUPT_ANNOTATION), Some("true"));
        assert_eq!(state(&removed), HoldState::Unheld);
        // A user's "safe-to-evict: true" (CA may evict) is not overridden either.
        let allow = pod(&[(SAFE_TO_EVICT_ANNOTATION, "true")]);
        let patch = place(&allow, BLOCK).expect("do-not-disrupt is missing");
        assert!(!patch.contains_key(SAFE_TO_EVICT_ANNOTATION));
    }

    #[test]
    fn release_then_restore_round_trips() {
        let p = apply(&pod(&[]), &place(&pod(&[]), BLOCK).expect("held"));
        let r = apply(&p, &release(&p, "plan-a").expect("released"));
        assert_eq!(state(&r), HoldState::Released("plan-a".into()));
        assert_eq!(ann(&r, DO_NOT_DISRUPT_ANNOTATION), None);
        assert_eq!(ann(&r, SAFE_TO_EVICT_ANNOTATION), None);
        assert_eq!(
            place(&r, BLOCK),
            None,
            "the keeper leaves a released pod alone"
        );
        assert_eq!(
            release(&r, "plan-a"),
            None,
            "releasing twice changes nothing"
        );
        let back = apply(&r, &restore(&r, BLOCK).expect("restored"));
        assert_eq!(
            state(&back),
            HoldState::Held(vec!["do-not-disrupt".into(), "safe-to-evict".into()])
        );
        assert_eq!(restore(&back, BLOCK), None);
    }

    #[test]
    fn a_value_changed_by_someone_else_is_not_removed_on_release() {
        let p = apply(&pod(&[]), &place(&pod(&[]), BLOCK).expect("held"));
        let changed = apply(
            &p,
            &[(
                DO_NOT_DISRUPT_ANNOTATION.to_string(),
                Some("30m".to_string()),
            )]
            .into(),
        );
        let r = apply(&changed, &release(&changed, "p").expect("released"));
        assert_eq!(ann(&r, DO_NOT_DISRUPT_ANNOTATION), Some("30m"));
    }

    #[test]
    fn the_patch_is_guarded_by_resource_version() {
        let mut p = pod(&[]);
        p.metadata.resource_version = Some("42".into());
        let body = merge_patch(&p, &place(&p, BLOCK).expect("held"));
        assert_eq!(body["metadata"]["resourceVersion"], "42");
        assert_eq!(
            body["metadata"]["annotations"][HELD_ANNOTATION],
            "do-not-disrupt,safe-to-evict"
        );
        let r = release(&p, "x").expect("release writes the mark");
        assert!(merge_patch(&p, &r)["metadata"]["annotations"][HELD_ANNOTATION].is_null());
    }

    fn node(annotations: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n
    }

    fn apply_node(n: &Node, patch: &AnnotationPatch) -> Node {
        let mut out = n.clone();
        let a = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in patch {
            match v {
                Some(v) => a.insert(k.clone(), v.clone()),
                None => a.remove(k),
            };
        }
        out
    }

    #[test]
    fn a_node_is_held_while_needed_and_only_karpenters_annotation_is_set() {
        let (action, patch) = node_change(&node(&[]), true).expect("a node that needs it is held");
        assert_eq!(action, "placed");
        let held = apply_node(&node(&[]), &patch);
        let a = held.metadata.annotations.as_ref().expect("annotated");
        assert_eq!(
            a.get(DO_NOT_DISRUPT_ANNOTATION).map(String::as_str),
            Some("true")
        );
        assert_eq!(
            a.get(HELD_ANNOTATION).map(String::as_str),
            Some("do-not-disrupt")
        );
        assert!(
            !a.contains_key(SAFE_TO_EVICT_ANNOTATION),
            "not a pod annotation's place"
        );
        assert_eq!(
            node_state(&held),
            HoldState::Held(vec!["do-not-disrupt".into()])
        );
        assert_eq!(
            node_change(&held, true),
            None,
            "placing twice changes nothing"
        );
        let (action, patch) = node_change(&held, false).expect("no longer needed");
        assert_eq!(action, "removed");
        let freed = apply_node(&held, &patch);
        assert_eq!(node_state(&freed), HoldState::Unheld);
        assert!(
            freed
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.is_empty())
        );
        assert_eq!(node_change(&freed, false), None);
    }

    #[test]
    fn a_users_own_node_annotation_is_never_taken_or_claimed() {
        let users = node(&[(DO_NOT_DISRUPT_ANNOTATION, "true")]);
        assert_eq!(node_change(&users, true), None, "already held, by the user");
        assert_eq!(
            node_change(&users, false),
            None,
            "not snapdrain's to remove"
        );
        assert_eq!(remove_from_node(&users), None);
        // Placed by snapdrain, then changed by someone: the mark goes, their value stays.
        let changed = node(&[
            (DO_NOT_DISRUPT_ANNOTATION, "false"),
            (HELD_ANNOTATION, "do-not-disrupt"),
        ]);
        let (_, patch) = node_change(&changed, false).expect("the mark goes");
        let after = apply_node(&changed, &patch);
        assert_eq!(
            after
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DO_NOT_DISRUPT_ANNOTATION))
                .map(String::as_str),
            Some("false")
        );
        assert_eq!(node_state(&after), HoldState::Unheld);
    }
}
