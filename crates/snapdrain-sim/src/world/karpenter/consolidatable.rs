//! The `Consolidatable` NodeClaim condition and the pod events that restart its clock.
//!
//! - Pod events (K: pkg/controllers/nodeclaim/podevents/controller.go): a non-DaemonSet pod bound to
//!   the node that is scheduled (PodScheduled's lastTransitionTime) or goes terminal or terminating
//!   (now) sets the NodeClaim's `status.lastPodEventTime`.
//! - The condition (K: pkg/controllers/nodeclaim/disruption/consolidation.go): True once the NodeClaim
//!   is Initialized and `consolidateAfter` has passed since lastPodEventTime (or initialization when
//!   no pod event was seen); cleared otherwise, and never set when `consolidateAfter: Never`.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::disruption::is_daemonset_pod;
use super::{condition_true, modify_claim, nodeclaims, remove_condition, set_condition};
use crate::apiserver::meta::meta_str;
use crate::apiserver::objects::CLAIM_NODE;
use crate::world::feed::Change;
use crate::world::go_duration;
use crate::world::objects::{is_terminal, is_terminating, node_name};

pub(super) const CONSOLIDATABLE: &str = "Consolidatable";

/// metav1.Time: RFC 3339, whole seconds.
fn rfc3339(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn pod_scheduled(pod: &Value) -> Option<(&str, &str)> {
    let c = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c["type"] == "PodScheduled")?;
    Some((
        c["status"].as_str().unwrap_or(""),
        c["lastTransitionTime"].as_str().unwrap_or(""),
    ))
}

fn gone(pod: &Value) -> bool {
    is_terminal(pod) || is_terminating(pod)
}

/// The node and time of one pod change, if it is a pod event Karpenter records.
fn event(c: &Change, now: jiff::Timestamp) -> Option<(String, jiff::Timestamp)> {
    let pod = c.new.as_deref().or(c.old.as_deref())?;
    let node = node_name(pod).filter(|n| !n.is_empty())?.to_string();
    if is_daemonset_pod(pod) {
        return None;
    }
    let Some(new) = c.new.as_deref() else {
        // A pod removed without being seen terminating (zero grace): the terminating event it had.
        return c.old.as_deref().filter(|o| !gone(o)).map(|_| (node, now));
    };
    if let Some(old) = c.old.as_deref() {
        // Updates count only when scheduling changed or the pod newly went terminal or terminating.
        let scheduling_changed = pod_scheduled(old) != pod_scheduled(new);
        let newly_gone = (!is_terminal(old) && is_terminal(new))
            || (!is_terminating(old) && is_terminating(new));
        if !scheduling_changed && !newly_gone {
            return None;
        }
    }
    if gone(new) {
        return Some((node, now));
    }
    let (status, ltt) = pod_scheduled(new)?;
    if status != "True" {
        return None;
    }
    Some((node, ltt.parse().ok()?))
}

/// Writes `status.lastPodEventTime` for the NodeClaims whose nodes saw pod events, found through the
/// store's index of NodeClaims by `status.nodeName` (not a pass over every NodeClaim).
pub(super) fn record_pod_events(ctx: &crate::world::WorldContext, changes: &[Change]) {
    if changes.is_empty() {
        return;
    }
    let now = jiff::Timestamp::now();
    let mut latest: HashMap<String, jiff::Timestamp> = HashMap::new();
    for (node, t) in changes.iter().filter_map(|c| event(c, now)) {
        let e = latest.entry(node).or_insert(t);
        *e = (*e).max(t);
    }
    for (node, t) in &latest {
        let at = rfc3339(*t);
        for claim in ctx.store.by_field(&nodeclaims(), CLAIM_NODE, node) {
            if claim
                .pointer("/status/lastPodEventTime")
                .and_then(Value::as_str)
                == Some(&at)
            {
                continue;
            }
            let name = meta_str(&claim, "name").unwrap_or("");
            let _ = modify_claim(ctx, name, |v| {
                v["status"]["lastPodEventTime"] = json!(at);
            });
        }
    }
}

/// The pool's `consolidateAfter`, or None when consolidation is off (`Never`, missing, unparsable).
pub(super) fn consolidate_after(pool: &Value) -> Option<Duration> {
    pool.pointer("/spec/disruption/consolidateAfter")
        .and_then(Value::as_str)
        .filter(|a| *a != "Never")
        .and_then(go_duration)
}

fn initialized_at(claim: &Value) -> Option<jiff::Timestamp> {
    claim
        .pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c["type"] == "Initialized" && c["status"] == "True")?
        .get("lastTransitionTime")?
        .as_str()?
        .parse()
        .ok()
}

/// From when the NodeClaim should carry Consolidatable=True (None: never, as things stand).
fn wanted_from(pool: Option<&Value>, claim: &Value) -> Option<jiff::Timestamp> {
    let (Some(after), Some(init)) = (pool.and_then(consolidate_after), initialized_at(claim))
    else {
        return None;
    };
    let since = claim
        .pointer("/status/lastPodEventTime")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .unwrap_or(init);
    let after = jiff::SignedDuration::try_from(after).ok()?;
    since.checked_add(after).ok()
}

/// Whether the NodeClaim should carry Consolidatable=True now.
#[cfg(test)]
fn wanted(pool: Option<&Value>, claim: &Value, now: jiff::Timestamp) -> bool {
    wanted_from(pool, claim).is_some_and(|from| now >= from)
}

/// Sets or clears Consolidatable on one NodeClaim, writing only when it changes. Returns when it is
/// due to turn True if it is not yet (the consolidation controller's RequeueAfter).
pub(super) fn reconcile(
    ctx: &crate::world::WorldContext,
    pool: Option<&Value>,
    claim: &Value,
) -> Option<jiff::Timestamp> {
    let now = jiff::Timestamp::now();
    let from = wanted_from(pool, claim);
    let want = from.is_some_and(|f| now >= f);
    let has = claim
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == CONSOLIDATABLE));
    let name = meta_str(claim, "name").unwrap_or("");
    if want && !condition_true(claim, CONSOLIDATABLE) {
        let _ = modify_claim(ctx, name, |v| {
            set_condition(v, CONSOLIDATABLE, "True", CONSOLIDATABLE, "")
        });
    } else if !want && has {
        let _ = modify_claim(ctx, name, |v| remove_condition(v, CONSOLIDATABLE));
    }
    from.filter(|_| !want)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn claim(init: &str, last_pod: Option<&str>) -> Value {
        let mut c = json!({"status": {"conditions": [{"type": "Initialized", "status": "True", "lastTransitionTime": init}]}});
        if let Some(t) = last_pod {
            c["status"]["lastPodEventTime"] = json!(t);
        }
        c
    }

    fn pool(after: &str) -> Value {
        json!({"spec": {"disruption": {"consolidateAfter": after}}})
    }

    // K: pkg/controllers/nodeclaim/disruption/consolidation.go
    #[test]
    fn consolidatable_after_consolidate_after_since_the_last_pod_event() {
        let now: jiff::Timestamp = "2026-01-01T00:10:00Z".parse().unwrap_or_default();
        let c = claim("2026-01-01T00:00:00Z", None);
        assert!(wanted(Some(&pool("5m")), &c, now));
        assert!(!wanted(Some(&pool("15m")), &c, now));
        assert!(!wanted(Some(&pool("Never")), &c, now));
        assert!(!wanted(None, &c, now));
        // A pod event restarts the clock.
        let c = claim("2026-01-01T00:00:00Z", Some("2026-01-01T00:08:00Z"));
        assert!(!wanted(Some(&pool("5m")), &c, now));
        assert!(wanted(Some(&pool("2m")), &c, now));
        // Not initialized: never.
        let c = json!({"status": {"conditions": []}});
        assert!(!wanted(Some(&pool("0s")), &c, now));
    }

    // K: pkg/controllers/nodeclaim/podevents/controller.go
    #[test]
    fn pod_events_are_scheduling_and_removal_not_other_updates() {
        let now: jiff::Timestamp = "2026-01-01T00:10:00Z".parse().unwrap_or_default();
        let running = Arc::new(
            json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:01:00Z"}]}}),
        );
        let key = (String::new(), "p".to_string());
        let created = Change {
            key: key.clone(),
            old: None,
            new: Some(running.clone()),
        };
        assert_eq!(
            event(&created, now).map(|(n, t)| (n, rfc3339(t))),
            Some(("n1".into(), "2026-01-01T00:01:00Z".into()))
        );
        let mut relabelled = (*running).clone();
        relabelled["metadata"] = json!({"labels": {"a": "b"}});
        let update = Change {
            key: key.clone(),
            old: Some(running.clone()),
            new: Some(Arc::new(relabelled)),
        };
        assert!(event(&update, now).is_none());
        let mut deleting = (*running).clone();
        deleting["metadata"] = json!({"deletionTimestamp": "2026-01-01T00:09:00Z"});
        let update = Change {
            key: key.clone(),
            old: Some(running.clone()),
            new: Some(Arc::new(deleting)),
        };
        assert_eq!(event(&update, now).map(|(_, t)| t), Some(now));
        let removed = Change {
            key: key.clone(),
            old: Some(running.clone()),
            new: None,
        };
        assert_eq!(event(&removed, now).map(|(_, t)| t), Some(now));
        let ds = Arc::new(
            json!({"metadata": {"ownerReferences": [{"kind": "DaemonSet"}]}, "spec": {"nodeName": "n1"}}),
        );
        assert!(
            event(
                &Change {
                    key,
                    old: Some(ds),
                    new: None
                },
                now
            )
            .is_none()
        );
    }
}
