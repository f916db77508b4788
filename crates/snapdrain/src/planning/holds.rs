//! Holds: the pod annotations that keep autoscalers away from a protected pod's node until its backup is
//! verified. Pure: each function returns the annotation changes (a merge patch's `metadata.annotations`,
//! `None` deleting a key) or nothing when the pod is already as wanted.
//!
//! - `karpenter.sh/do-not-disrupt: "true"`: Karpenter's graceful methods skip the node; its forceful
//!   termination waits for the pod until terminationGracePeriod runs out (kubernetes-sigs/karpenter
//!   `pkg/utils/pod/scheduling.go` `IsDoNotDisruptActive`, `pkg/controllers/node/termination/terminator`).
//! - `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`: Cluster Autoscaler does not scale the node
//!   down (kubernetes/autoscaler `cluster-autoscaler/utils/drain/drain.go`, FAQ "What types of pods can
//!   prevent CA from removing a node?").
//!
//! [`HELD_ANNOTATION`] lists which of the two snapdrain set itself: a value a user wrote is never
//! changed or removed. A released pod carries [`RELEASED_ANNOTATION`] (the plan that released it), so
//! the hold keeper leaves it alone while that plan runs and restores the hold when the plan is over.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::inventory::DO_NOT_DISRUPT_ANNOTATION;

pub const SAFE_TO_EVICT_ANNOTATION: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// Which hold annotations snapdrain placed, comma-separated (`do-not-disrupt,safe-to-evict`).
pub const HELD_ANNOTATION: &str = "snapdrain.io/held";
/// The plan that released the pod's holds.
pub const RELEASED_ANNOTATION: &str = "snapdrain.io/released-by";

/// The two holds: (annotation, the value that holds, the short name in [`HELD_ANNOTATION`]).
const HOLDS: [(&str, &str, &str); 2] = [
    (DO_NOT_DISRUPT_ANNOTATION, "true", "do-not-disrupt"),
    (SAFE_TO_EVICT_ANNOTATION, "false", "safe-to-evict"),
];

/// Annotation changes: `Some(value)` sets, `None` deletes.
pub type AnnotationPatch = BTreeMap<String, Option<String>>;

/// How a pod stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldState {
    /// No hold of snapdrain's (there may be a user's own annotations).
    Unheld,
    /// snapdrain placed these (short names).
    Held(Vec<String>),
    /// Released by this plan.
    Released(String),
}

fn annotations(pod: &Pod) -> Option<&BTreeMap<String, String>> {
    pod.metadata.annotations.as_ref()
}

fn get<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    annotations(pod)
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn ours(pod: &Pod) -> Vec<String> {
    get(pod, HELD_ANNOTATION)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

pub fn state(pod: &Pod) -> HoldState {
    if let Some(plan) = get(pod, RELEASED_ANNOTATION) {
        return HoldState::Released(plan.to_owned());
    }
    let ours = ours(pod);
    if ours.is_empty() {
        HoldState::Unheld
    } else {
        HoldState::Held(ours)
    }
}

/// True when the pod's active `do-not-disrupt` is snapdrain's own hold (it stands for "not before the
/// backup is verified", which a plan's drain checks itself), not a user's.
pub fn own_do_not_disrupt(pod: &Pod) -> bool {
    get(pod, DO_NOT_DISRUPT_ANNOTATION) == Some("true")
        && ours(pod).iter().any(|m| m == "do-not-disrupt")
}

/// Places the holds snapdrain may place: each hold annotation the pod does not carry yet. A released pod
/// is left alone (see [`restore`]).
pub fn place(pod: &Pod) -> Option<AnnotationPatch> {
    if get(pod, RELEASED_ANNOTATION).is_some() {
        return None;
    }
    let mut mine = ours(pod);
    let mut patch = AnnotationPatch::new();
    for (key, value, short) in HOLDS {
        let owned = mine.iter().any(|m| m == short);
        match get(pod, key) {
            // Ours and in place, or a user's own value: nothing to do.
            Some(_) => {}
            // Ours but removed by someone (or never written): put it back.
            None => {
                patch.insert(key.to_owned(), Some(value.to_owned()));
                if !owned {
                    mine.push(short.to_owned());
                }
            }
        }
    }
    if patch.is_empty() {
        return None;
    }
    patch.insert(HELD_ANNOTATION.to_owned(), Some(mine.join(",")));
    Some(patch)
}

/// Removes the holds snapdrain placed (only where the value is still the one it wrote) and marks the
/// pod released by `plan`.
pub fn release(pod: &Pod, plan: &str) -> Option<AnnotationPatch> {
    if get(pod, RELEASED_ANNOTATION) == Some(plan) && ours(pod).is_empty() {
        return None;
    }
    let mut patch = remove_ours(pod);
    patch.insert(HELD_ANNOTATION.to_owned(), None);
    patch.insert(RELEASED_ANNOTATION.to_owned(), Some(plan.to_owned()));
    Some(patch)
}

/// Takes away the release mark and puts the holds back.
pub fn restore(pod: &Pod) -> Option<AnnotationPatch> {
    get(pod, RELEASED_ANNOTATION)?;
    let mut unmarked = pod.clone();
    if let Some(a) = unmarked.metadata.annotations.as_mut() {
        a.remove(RELEASED_ANNOTATION);
    }
    let mut patch = place(&unmarked).unwrap_or_default();
    patch.insert(RELEASED_ANNOTATION.to_owned(), None);
    Some(patch)
}

/// Removes every trace of snapdrain's holds (a pod no longer protected, or `snapdrain holds release`).
pub fn remove(pod: &Pod) -> Option<AnnotationPatch> {
    let marked = get(pod, HELD_ANNOTATION).is_some() || get(pod, RELEASED_ANNOTATION).is_some();
    if !marked {
        return None;
    }
    let mut patch = remove_ours(pod);
    patch.insert(HELD_ANNOTATION.to_owned(), None);
    patch.insert(RELEASED_ANNOTATION.to_owned(), None);
    Some(patch)
}

fn remove_ours(pod: &Pod) -> AnnotationPatch {
    let mine = ours(pod);
    HOLDS
        .iter()
        .filter(|(key, value, short)| {
            mine.iter().any(|m| m == short) && get(pod, key) == Some(*value)
        })
        .map(|(key, _, _)| (key.to_string(), None))
        .collect()
}

/// The `metadata` of a JSON merge patch applying `patch`, guarded by the pod's resourceVersion so a
/// concurrent change (a user's own annotation) makes it fail with 409 instead of being overwritten.
pub fn merge_patch(pod: &Pod, patch: &AnnotationPatch) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "resourceVersion": pod.metadata.resource_version,
            "annotations": patch,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        get(p, k)
    }

    #[test]
    fn a_new_pod_gets_both_holds_marked_as_snapdrains() {
        let p = apply(&pod(&[]), &place(&pod(&[])).expect("a new pod is held"));
        assert_eq!(ann(&p, DO_NOT_DISRUPT_ANNOTATION), Some("true"));
        assert_eq!(ann(&p, SAFE_TO_EVICT_ANNOTATION), Some("false"));
        assert_eq!(
            state(&p),
            HoldState::Held(vec!["do-not-disrupt".into(), "safe-to-evict".into()])
        );
        assert_eq!(place(&p), None, "placing twice changes nothing");
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
            &place(&user).expect("safe-to-evict is still missing"),
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
        let patch = place(&allow).expect("do-not-disrupt is missing");
        assert!(!patch.contains_key(SAFE_TO_EVICT_ANNOTATION));
    }

    #[test]
    fn release_then_restore_round_trips() {
        let p = apply(&pod(&[]), &place(&pod(&[])).expect("held"));
        let r = apply(&p, &release(&p, "plan-a").expect("released"));
        assert_eq!(state(&r), HoldState::Released("plan-a".into()));
        assert_eq!(ann(&r, DO_NOT_DISRUPT_ANNOTATION), None);
        assert_eq!(ann(&r, SAFE_TO_EVICT_ANNOTATION), None);
        assert_eq!(place(&r), None, "the keeper leaves a released pod alone");
        assert_eq!(
            release(&r, "plan-a"),
            None,
            "releasing twice changes nothing"
        );
        let back = apply(&r, &restore(&r).expect("restored"));
        assert_eq!(
            state(&back),
            HoldState::Held(vec!["do-not-disrupt".into(), "safe-to-evict".into()])
        );
        assert_eq!(restore(&back), None);
    }

    #[test]
    fn a_value_changed_by_someone_else_is_not_removed_on_release() {
        let p = apply(&pod(&[]), &place(&pod(&[])).expect("held"));
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
        let body = merge_patch(&p, &place(&p).expect("held"));
        assert_eq!(body["metadata"]["resourceVersion"], "42");
        assert_eq!(
            body["metadata"]["annotations"][HELD_ANNOTATION],
            "do-not-disrupt,safe-to-evict"
        );
        let r = release(&p, "x").expect("release writes the mark");
        assert!(merge_patch(&p, &r)["metadata"]["annotations"][HELD_ANNOTATION].is_null());
    }
}
