//! Eviction order and the meaning of eviction API answers.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::core::Status;

use super::inventory::{is_critical, is_daemonset_pod};

/// Karpenter's eviction tiers, in order: a tier starts only when the previous one is empty, so critical
/// pods (DNS, CNI) keep serving while the rest drains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EvictionTier {
    NonCritical,
    NonCriticalDaemonSet,
    Critical,
    CriticalDaemonSet,
}

/// The tier a pod belongs to.
pub fn eviction_tier(pod: &Pod) -> EvictionTier {
    match (is_critical(pod), is_daemonset_pod(pod)) {
        (false, false) => EvictionTier::NonCritical,
        (false, true) => EvictionTier::NonCriticalDaemonSet,
        (true, false) => EvictionTier::Critical,
        (true, true) => EvictionTier::CriticalDaemonSet,
    }
}

/// One pod to evict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEviction {
    pub namespace: String,
    pub name: String,
    /// Sent as `deleteOptions.preconditions.uid`, so a StatefulSet replacement with the same name is never
    /// evicted by mistake.
    pub uid: Option<String>,
    pub tier: EvictionTier,
    /// Covered by a backup (or would be, under policy skip).
    pub protected: bool,
    /// Names of the PDBs covering the pod; more than one makes the eviction API answer 500 until fixed.
    pub pdbs: Vec<String>,
    /// Already being deleted: the eviction returns quickly, but the drain still waits for it.
    pub terminating: bool,
    /// Carries an active `karpenter.sh/do-not-disrupt` (and `drain.force` is off): held, not evicted.
    pub do_not_disrupt: bool,
}

/// What an eviction API answer means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// 200/201: eviction accepted; wait for the pod to go.
    Evicted,
    /// 404 (pod gone) or 409 (UID precondition failed: the name now belongs to a new pod).
    AlreadyGone,
    /// Try again after at least `delay` (add jitter/backoff on top). `reason` says what blocks it.
    RetryAfter { delay: Duration, reason: String },
    /// Will not succeed by retrying as is.
    Failed { message: String },
}

/// Wait used when the server gives no (or a zero) `retryAfterSeconds`: kubectl's 5 s. Never retry at once.
pub const DEFAULT_EVICTION_RETRY: Duration = Duration::from_secs(5);

/// The eviction subresource's answer for a pod covered by several PDBs.
pub const MULTIPLE_PDB_MESSAGE: &str = "more than one PodDisruptionBudget";

/// Classifies the answer to `POST pods/{name}/eviction`. `body` is the Status the API server returned
/// (what `kube::Error::Api` carries), if any.
pub fn classify_eviction(status_code: u16, body: Option<&Status>) -> EvictionOutcome {
    let message = body.map(|s| s.message.clone()).filter(|m| !m.is_empty());
    let retry_hint = body
        .and_then(|s| s.details.as_ref())
        .map(|d| d.retry_after_seconds)
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(u64::from(s)));
    let delay = retry_hint.unwrap_or(DEFAULT_EVICTION_RETRY);
    let describe = |fallback: &str| message.clone().unwrap_or_else(|| fallback.to_owned());
    match status_code {
        200..=299 => EvictionOutcome::Evicted,
        404 | 409 => EvictionOutcome::AlreadyGone,
        // PDB budget exhausted or still being processed, or an eviction gate (snapdrain's own, KubeVirt)
        // asking to come back later.
        429 => EvictionOutcome::RetryAfter {
            delay,
            reason: describe("too many requests (PodDisruptionBudget)"),
        },
        500 if message
            .as_deref()
            .is_some_and(|m| m.contains(MULTIPLE_PDB_MESSAGE)) =>
        {
            EvictionOutcome::RetryAfter {
                delay,
                reason: describe(MULTIPLE_PDB_MESSAGE),
            }
        }
        403 if is_namespace_terminating(body) => EvictionOutcome::RetryAfter {
            delay,
            reason: describe("namespace is terminating"),
        },
        // The apiserver's PDB update conflict ("couldn't update PodDisruptionBudget ... due to conflicts").
        504 if message
            .as_deref()
            .is_some_and(|m| m.contains("PodDisruptionBudget")) =>
        {
            EvictionOutcome::RetryAfter {
                delay,
                reason: describe("PodDisruptionBudget update conflict"),
            }
        }
        code => EvictionOutcome::Failed {
            message: format!(
                "eviction refused with HTTP {code}: {}",
                describe("no message")
            ),
        },
    }
}

fn is_namespace_terminating(body: Option<&Status>) -> bool {
    let Some(s) = body else { return false };
    s.details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
        || s.message.contains("because it is being terminated")
}

/// True when the pod is gone: not found (`observed_uid` None) or the name now belongs to another pod.
pub fn pod_gone(expected_uid: &str, observed_uid: Option<&str>) -> bool {
    observed_uid.is_none_or(|uid| uid != expected_uid)
}

#[cfg(test)]
mod tests {
    use super::super::inventory::fixtures::*;
    use super::*;
    use serde_json::json;

    fn status(v: serde_json::Value) -> Status {
        serde_json::from_value(v).expect("status")
    }

    #[test]
    fn tiers_follow_karpenter() {
        assert_eq!(
            eviction_tier(&deploy_pod("web", "api")),
            EvictionTier::NonCritical
        );
        assert_eq!(
            eviction_tier(&ds_pod("kube-system", "logs", None)),
            EvictionTier::NonCriticalDaemonSet
        );
        let dns = with(
            deploy_pod("kube-system", "coredns"),
            json!({"spec": {"priorityClassName": "system-cluster-critical"}}),
        );
        assert_eq!(eviction_tier(&dns), EvictionTier::Critical);
        assert_eq!(
            eviction_tier(&ds_pod("kube-system", "cni", Some("system-node-critical"))),
            EvictionTier::CriticalDaemonSet
        );
        assert!(EvictionTier::NonCritical < EvictionTier::NonCriticalDaemonSet);
        assert!(EvictionTier::NonCriticalDaemonSet < EvictionTier::Critical);
        assert!(EvictionTier::Critical < EvictionTier::CriticalDaemonSet);
    }

    #[test]
    fn success_and_gone() {
        assert_eq!(classify_eviction(201, None), EvictionOutcome::Evicted);
        assert_eq!(classify_eviction(200, None), EvictionOutcome::Evicted);
        assert_eq!(classify_eviction(404, None), EvictionOutcome::AlreadyGone);
        assert_eq!(classify_eviction(409, None), EvictionOutcome::AlreadyGone);
    }

    #[test]
    fn pdb_429_without_hint_waits_the_default() {
        let body = status(
            json!({"status": "Failure", "code": 429, "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget pg needs 2 healthy pods and has 2 currently"}]}}),
        );
        match classify_eviction(429, Some(&body)) {
            EvictionOutcome::RetryAfter { delay, reason } => {
                assert_eq!(delay, DEFAULT_EVICTION_RETRY);
                assert!(reason.contains("disruption budget"));
            }
            other => panic!("expected retry, got {other:?}"),
        }
        assert!(
            matches!(classify_eviction(429, None), EvictionOutcome::RetryAfter { delay, .. } if delay == DEFAULT_EVICTION_RETRY)
        );
    }

    #[test]
    fn retry_after_seconds_is_honoured() {
        let body = status(
            json!({"code": 429, "message": "The disruption budget pg is still being processed by the server.",
            "details": {"retryAfterSeconds": 10}}),
        );
        assert!(matches!(classify_eviction(429, Some(&body)),
            EvictionOutcome::RetryAfter { delay, .. } if delay == Duration::from_secs(10)));
    }

    #[test]
    fn multiple_pdbs_500_is_retried_other_500_fails() {
        let body = status(
            json!({"code": 500, "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."}),
        );
        assert!(matches!(
            classify_eviction(500, Some(&body)),
            EvictionOutcome::RetryAfter { .. }
        ));
        let other = status(json!({"code": 500, "message": "etcdserver: request timed out"}));
        match classify_eviction(500, Some(&other)) {
            EvictionOutcome::Failed { message } => {
                assert!(message.contains("HTTP 500") && message.contains("etcdserver"))
            }
            o => panic!("expected failure, got {o:?}"),
        }
    }

    #[test]
    fn namespace_terminating_403_is_retried_other_403_fails() {
        let body = status(json!({"code": 403, "reason": "Forbidden",
            "message": "pods \"pg-0\" is forbidden: unable to create new content in namespace db because it is being terminated",
            "details": {"causes": [{"reason": "NamespaceTerminating", "message": "namespace db is being terminated"}]}}));
        assert!(matches!(
            classify_eviction(403, Some(&body)),
            EvictionOutcome::RetryAfter { .. }
        ));
        let rbac = status(
            json!({"code": 403, "message": "pods \"pg-0\" is forbidden: User cannot create resource pods/eviction"}),
        );
        assert!(matches!(
            classify_eviction(403, Some(&rbac)),
            EvictionOutcome::Failed { .. }
        ));
    }

    #[test]
    fn gone_on_404_or_uid_change() {
        assert!(pod_gone("u1", None));
        assert!(pod_gone("u1", Some("u2")));
        assert!(!pod_gone("u1", Some("u1")));
    }
}
