//! The promise, checked from the outside: every eviction of a protected pod that the API server accepted
//! came after a verified backup covering all of that pod's PVCs. A pod DELETE counts as its leaving too:
//! Karpenter force-deletes pods at `terminationTime − grace` with no eviction at all
//! (kubernetes-sigs/karpenter `pkg/controllers/node/termination/terminator/eviction.go` `forceDelete`).
//!
//! The evidence is the simulator's audit log (what the API server really accepted, whoever asked) and the
//! plan's backup records (when each backup was verified). The check is a pure function so the demo, the
//! tests and anyone holding an audit dump can run it.
//!
//! The oracle is independent of what it judges: it states the protection rule itself (DESIGN.md, "The
//! promise": a pod controlled by a StatefulSet that mounts a PersistentVolumeClaim) and reads backup
//! records from the plan's JSON, so a mistake in snapdrain's own rule or types cannot hide a violation.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use serde_json::Value;
use snapdrain_sim::apiserver::audit::AuditEntry;

/// An eviction the API server accepted (HTTP 201), as recorded in the audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptedEviction {
    /// `namespace/name`.
    pub pod: String,
    /// The audit entry's time, as written (RFC 3339, milliseconds).
    pub time: String,
    pub user_agent: Option<String>,
    /// A DELETE of the pod (no eviction for a PDB or the eviction gate to judge), not an eviction.
    pub deleted: bool,
}

impl AcceptedEviction {
    /// How the pod left and who asked, for a violation's text: `evicted by <User-Agent>`.
    pub fn how(&self) -> String {
        format!(
            "{} by {}",
            if self.deleted { "deleted" } else { "evicted" },
            self.user_agent.as_deref().unwrap_or("an unnamed client")
        )
    }
}

/// Evictions that removed a pod, in audit order: an eviction request answered 201 for which the
/// simulated API server recorded the pod as evicted before answering. A 201 alone is not enough: an
/// older kube-apiserver answers a refused multi-PDB eviction 201 with a Failure body.
pub fn accepted_evictions(audit: &[AuditEntry]) -> Vec<AcceptedEviction> {
    let pod = |e: &AuditEntry| {
        format!(
            "{}/{}",
            e.namespace.as_deref().unwrap_or_default(),
            e.name.as_deref().unwrap_or_default()
        )
    };
    // Pods evicted by the server and not yet matched to their request's answer.
    let mut removed: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for e in audit {
        if e.source == "world" && e.verb == "evicted" && e.resource == "pods" {
            *removed.entry(pod(e)).or_default() += 1;
        } else if e.source == "api" && e.resource == "pods/eviction" && e.code == Some(201) {
            let p = pod(e);
            if let Some(n) = removed.get_mut(&p).filter(|n| **n > 0) {
                *n -= 1;
                out.push(AcceptedEviction {
                    pod: p,
                    time: e.time.clone(),
                    user_agent: e.user_agent.clone(),
                    deleted: false,
                });
            }
        }
    }
    out
}

/// Pods DELETEd through the API server (answered 200 or 202), in audit order: Karpenter's force-delete at
/// `terminationTime − grace`, a person's `kubectl delete pod`. The pod leaves as surely as an evicted one,
/// with no eviction for a PDB or the eviction gate to judge.
pub fn accepted_deletions(audit: &[AuditEntry]) -> Vec<AcceptedEviction> {
    audit
        .iter()
        .filter(|e| {
            e.source == "api"
                && e.verb == "delete"
                && e.resource == "pods"
                && e.name.is_some()
                && matches!(e.code, Some(200 | 202))
        })
        .map(|e| AcceptedEviction {
            pod: format!(
                "{}/{}",
                e.namespace.as_deref().unwrap_or_default(),
                e.name.as_deref().unwrap_or_default()
            ),
            time: e.time.clone(),
            user_agent: e.user_agent.clone(),
            deleted: true,
        })
        .collect()
}

/// Every way a pod left through the API: accepted evictions and deletions, by time.
pub fn pods_removed(audit: &[AuditEntry]) -> Vec<AcceptedEviction> {
    let mut out = accepted_evictions(audit);
    out.extend(accepted_deletions(audit));
    // RFC 3339 with milliseconds, all in UTC: the text sorts as the time.
    out.sort_by(|a, b| a.time.cmp(&b.time));
    out
}

/// Protected pods as `namespace/name` → the PVC claim names they mount: pods whose controller is a
/// StatefulSet and that mount at least one PVC. Pods are taken as JSON (from the API or a scenario) before
/// the disruption: afterwards the evicted pods are gone or recreated elsewhere.
pub fn protected_pods(pods: &[Value]) -> BTreeMap<String, BTreeSet<String>> {
    pods.iter()
        .filter_map(|p| {
            let by_statefulset = p
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| {
                    refs.iter().any(|r| {
                        r["kind"] == "StatefulSet"
                            && r["apiVersion"] == "apps/v1"
                            && r["controller"] == true
                    })
                });
            let claims: BTreeSet<String> = p
                .pointer("/spec/volumes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.pointer("/persistentVolumeClaim/claimName")?.as_str())
                .map(str::to_string)
                .collect();
            let name = p.pointer("/metadata/name")?.as_str()?;
            let ns = p.pointer("/metadata/namespace")?.as_str()?;
            (by_statefulset && !claims.is_empty()).then(|| (format!("{ns}/{name}"), claims))
        })
        .collect()
}

/// A backup as the plan's status records it, read from JSON (`status.backups[]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedBackup {
    pub name: String,
    pub namespace: String,
    pub pvcs: Vec<String>,
    pub verified_at: Option<Timestamp>,
}

/// The backup records of a plan (its JSON as the API returns it). A record whose `verifiedAt` cannot be
/// read counts as unverified.
pub fn recorded_backups(plan: &Value) -> Vec<RecordedBackup> {
    plan.pointer("/status/backups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|b| RecordedBackup {
            name: b["name"].as_str().unwrap_or_default().to_string(),
            namespace: b["namespace"].as_str().unwrap_or_default().to_string(),
            pvcs: b["pvcs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
            verified_at: b["verifiedAt"].as_str().and_then(|t| t.parse().ok()),
        })
        .collect()
}

/// One way the promise was broken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A protected pod was evicted while some of its PVCs had no verified backup at all.
    NotCovered {
        pod: String,
        evicted_at: String,
        pvcs: Vec<String>,
        /// How it left and who asked ([`AcceptedEviction::how`]).
        how: String,
    },
    /// A verified backup covers the pod's PVCs, but it was verified only after the eviction.
    EvictedBeforeVerified {
        pod: String,
        evicted_at: String,
        backup: String,
        verified_at: String,
        how: String,
    },
    /// The audit time cannot be read, so the order cannot be proven.
    UnreadableTime { pod: String, time: String },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotCovered {
                pod,
                evicted_at,
                pvcs,
                how,
            } => write!(
                f,
                "protected pod {pod} was {how} at {evicted_at} but no verified backup covers its PVC(s) {}",
                pvcs.join(", ")
            ),
            Self::EvictedBeforeVerified {
                pod,
                evicted_at,
                backup,
                verified_at,
                how,
            } => write!(
                f,
                "protected pod {pod} was {how} at {evicted_at}, before backup {backup} was verified at {verified_at}"
            ),
            Self::UnreadableTime { pod, time } => write!(
                f,
                "the eviction of protected pod {pod} has an unreadable audit time {time:?}; its order against the backup cannot be checked"
            ),
        }
    }
}

/// Checks every accepted eviction of a protected pod against the verified backups: each PVC of the pod
/// must be covered by a backup record (same namespace, claim listed) verified strictly before the
/// eviction. Returns the violations, empty when the promise held.
///
/// Audit times have millisecond precision and verification times microsecond precision; comparing the
/// truncated eviction time strictly is conservative: it can report a violation for a sub-millisecond
/// race, never miss one.
pub fn eviction_violations(
    evictions: &[AcceptedEviction],
    protected: &BTreeMap<String, BTreeSet<String>>,
    backups: &[RecordedBackup],
) -> Vec<Violation> {
    eviction_violations_with_snapshots(evictions, protected, backups, &EbsEvidence::default())
}

/// An EBS snapshot as EC2 itself holds it: read from the simulated EC2's own state (or DescribeSnapshots),
/// never from a plan's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ec2Snapshot {
    pub snapshot_id: String,
    pub volume_id: String,
    /// When EC2 started it: the data's point in time (EBS user guide, "Create Amazon EBS snapshots":
    /// "The snapshot is created immediately, but it remains in the `pending` state until all of data has
    /// been transferred to Amazon S3", https://docs.aws.amazon.com/ebs/latest/userguide/ebs-creating-snapshot.html).
    pub start_time: Timestamp,
    pub tags: BTreeMap<String, String>,
    /// EC2's state name (`pending`, `completed`, `error`): one that ended in `error` holds nothing.
    pub state: String,
}

impl Ec2Snapshot {
    /// Every snapshot the simulated EC2 of `cluster` holds (none when it runs no EC2): its own state.
    pub fn all_of(cluster: &snapdrain_sim::SimCluster) -> Vec<Ec2Snapshot> {
        cluster
            .ec2
            .as_ref()
            .map(|e| e.snapshots())
            .unwrap_or_default()
            .into_iter()
            .map(|s| Ec2Snapshot {
                snapshot_id: s.id,
                volume_id: s.volume_id,
                start_time: s.start_time,
                tags: s.tags,
                state: s.state.name().to_string(),
            })
            .collect()
    }
}

/// What lets a protected pod go at an EBS snapshot instead of a verified backup (DESIGN.md, "The
/// promise": a forceful plan that cannot reach the verified point in time releases at the snapshot).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EbsEvidence {
    /// `namespace/claim` → the EC2 volume id of its EBS PV (`spec.csi.volumeHandle` of driver
    /// `ebs.csi.aws.com`), read from the cluster before the disruption. Claims not here are not EBS.
    pub claim_volumes: BTreeMap<String, String>,
    pub snapshots: Vec<Ec2Snapshot>,
    /// The uids of the plans whose snapshots count (their `snapdrain.io/plan-uid` tag).
    pub plan_uids: BTreeSet<String>,
    /// The CSI snapshots the storage cut for Velero Backups, from the simulated world's own record.
    pub csi_cuts: Vec<CsiCutEvidence>,
    /// The uids of the plans whose spec (the user's input, not a decision) asks to release network
    /// volumes at their CSI snapshot (`spec.backup.releaseNetworkVolumesAt: Snapshot`).
    pub snapshot_release_uids: BTreeSet<String>,
    /// When each pod (`namespace/name`) started on a node, from the world's own records
    /// ([`pod_starts`]): a snapshot cut before the pod last started holds an older state of its volume
    /// (one its previous node's plan cut), not what it wrote where it was evicted from. Empty: no bound.
    pub pod_starts: BTreeMap<String, Vec<Timestamp>>,
}

/// When each pod (`namespace/name`) started on a node: the world's `started` records of pods.
pub fn pod_starts(audit: &[AuditEntry]) -> BTreeMap<String, Vec<Timestamp>> {
    let mut starts: BTreeMap<String, Vec<Timestamp>> = BTreeMap::new();
    for a in audit {
        if !(a.source == "world" && a.verb == "started" && a.resource == "pods") {
            continue;
        }
        if let (Some(ns), Some(name), Ok(t)) =
            (a.namespace.as_deref(), a.name.as_deref(), a.time.parse())
        {
            starts.entry(format!("{ns}/{name}")).or_default().push(t);
        }
    }
    starts
}

/// A CSI snapshot of a claim's volume, cut for a Velero Backup, and the plan that Backup belongs to
/// (its `snapdrain.io/plan-uid` label, read from the Backup object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsiCutEvidence {
    /// `namespace/claim`.
    pub claim: String,
    /// The PV's `spec.csi.volumeHandle` the driver snapshotted.
    pub volume_handle: String,
    pub plan_uid: Option<String>,
    pub cut_at: Timestamp,
}

/// The label snapdrain puts on its Velero Backups, restated here (the oracle does not import it).
pub const BACKUP_PLAN_UID_LABEL: &str = "snapdrain.io/plan-uid";

/// Every CSI snapshot the simulated CSI driver of `cluster` cut (none when it runs no Velero), each with
/// the plan uid label of the Velero Backup it was cut for (read from the Backup object; a Backup gone
/// since leaves it None, which counts for no plan).
pub fn csi_cuts_of(cluster: &snapdrain_sim::SimCluster) -> Vec<CsiCutEvidence> {
    let Some(velero) = cluster.velero.as_ref() else {
        return Vec::new();
    };
    let backups = cluster
        .store
        .snapshot(&snapdrain_sim::apiserver::resources::ResKey::new(
            "velero.io",
            "backups",
        ))
        .0;
    velero
        .csi_cuts()
        .into_iter()
        .map(|c| CsiCutEvidence {
            claim: format!("{}/{}", c.namespace, c.pvc),
            volume_handle: c.volume_handle,
            plan_uid: backups
                .iter()
                .find(|b| {
                    b.pointer("/metadata/name").and_then(Value::as_str) == Some(c.backup.as_str())
                })
                .and_then(|b| {
                    b.pointer("/metadata/labels")?
                        .get(BACKUP_PLAN_UID_LABEL)?
                        .as_str()
                })
                .map(str::to_owned),
            cut_at: c.cut_at,
        })
        .collect()
}

/// Reads a plan's uid when its spec asks for the release at the CSI snapshot.
pub fn snapshot_release_uid(plan: &Value) -> Option<String> {
    let asks = plan
        .pointer("/spec/backup/releaseNetworkVolumesAt")
        .and_then(Value::as_str)
        == Some("Snapshot");
    asks.then(|| plan.pointer("/metadata/uid")?.as_str().map(str::to_owned))
        .flatten()
}

/// The tag the product puts on its emergency snapshots, restated here: the oracle does not import the
/// product's constants.
pub const PLAN_UID_TAG: &str = "snapdrain.io/plan-uid";

impl EbsEvidence {
    /// True when `claim` of `pod`, evicted at `at`, was saved by a snapshot: [`Self::saved_between`]
    /// the pod's last start before `at` (its [`Self::pod_starts`]; none known: no bound) and `at`.
    fn saves(&self, pod: &str, claim: &str, at: Timestamp) -> bool {
        let since = self
            .pod_starts
            .get(pod)
            .and_then(|starts| starts.iter().filter(|t| **t <= at).max().copied());
        self.saved_between(claim, since, at)
    }

    /// True when EC2 holds a snapshot of `claim`'s EBS volume, tagged with one of the plans' uids,
    /// started at or after `since` and strictly before `before`, and not ended in `error`; or when a
    /// CSI snapshot of it was cut in that span for a plan that asked to release network volumes at the
    /// snapshot.
    pub fn saved_between(&self, claim: &str, since: Option<Timestamp>, before: Timestamp) -> bool {
        let Some(volume) = self.claim_volumes.get(claim) else {
            return false;
        };
        let within = |t: Timestamp| since.is_none_or(|s| t >= s) && t < before;
        // A release at the CSI snapshot: the claim's own EBS volume, cut for a Backup of a plan that asked
        // for it.
        let cut = self.csi_cuts.iter().any(|c| {
            c.claim == claim
                && &c.volume_handle == volume
                && c.plan_uid
                    .as_ref()
                    .is_some_and(|u| self.snapshot_release_uids.contains(u))
                && within(c.cut_at)
        });
        cut || self.snapshots.iter().any(|s| {
            &s.volume_id == volume
                && s.tags
                    .get(PLAN_UID_TAG)
                    .is_some_and(|uid| self.plan_uids.contains(uid))
                && within(s.start_time)
                && s.state != "error"
        })
    }
}

/// `namespace/claim` → EC2 volume id of each EBS CSI PV bound to a claim, from PV JSON.
pub fn ebs_claim_volumes(pvs: &[Value]) -> BTreeMap<String, String> {
    pvs.iter()
        .filter(|pv| {
            pv.pointer("/spec/csi/driver").and_then(Value::as_str) == Some("ebs.csi.aws.com")
        })
        .filter_map(|pv| {
            let ns = pv.pointer("/spec/claimRef/namespace")?.as_str()?;
            let claim = pv.pointer("/spec/claimRef/name")?.as_str()?;
            let vol = pv.pointer("/spec/csi/volumeHandle")?.as_str()?;
            Some((format!("{ns}/{claim}"), vol.to_string()))
        })
        .collect()
}

/// [`eviction_violations`], where a claim also counts as saved when `ebs` shows EC2 holding a snapshot of
/// its EBS volume, tagged with the plan's uid, started before the eviction. Node-local claims and every
/// other unbacked eviction stay violations.
pub fn eviction_violations_with_snapshots(
    evictions: &[AcceptedEviction],
    protected: &BTreeMap<String, BTreeSet<String>>,
    backups: &[RecordedBackup],
    ebs: &EbsEvidence,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for ev in evictions {
        let Some(claims) = protected.get(&ev.pod) else {
            continue;
        };
        let Ok(evicted_at) = ev.time.parse::<Timestamp>() else {
            violations.push(Violation::UnreadableTime {
                pod: ev.pod.clone(),
                time: ev.time.clone(),
            });
            continue;
        };
        let namespace = ev.pod.split_once('/').map_or("", |(ns, _)| ns);
        let mut uncovered = Vec::new();
        for claim in claims {
            if ebs.saves(&ev.pod, &format!("{namespace}/{claim}"), evicted_at) {
                continue;
            }
            // The earliest verification of a backup holding this claim decides.
            let earliest = backups
                .iter()
                .filter(|b| b.namespace == namespace && b.pvcs.iter().any(|p| p == claim))
                .filter_map(|b| b.verified_at.map(|t| (t, b)))
                .min_by_key(|(t, _)| *t);
            match earliest {
                None => uncovered.push(claim.clone()),
                Some((verified_at, _)) if verified_at < evicted_at => {}
                Some((verified_at, b)) => violations.push(Violation::EvictedBeforeVerified {
                    pod: ev.pod.clone(),
                    evicted_at: ev.time.clone(),
                    backup: b.name.clone(),
                    verified_at: verified_at.to_string(),
                    how: ev.how(),
                }),
            }
        }
        if !uncovered.is_empty() {
            violations.push(Violation::NotCovered {
                pod: ev.pod.clone(),
                evicted_at: ev.time.clone(),
                pvcs: uncovered,
                how: ev.how(),
            });
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(ns: &str, pvcs: &[&str], verified_at: Option<&str>) -> RecordedBackup {
        RecordedBackup {
            name: format!("b-{ns}"),
            namespace: ns.into(),
            pvcs: pvcs.iter().map(|p| p.to_string()).collect(),
            verified_at: verified_at.map(|t| t.parse().expect("test time")),
        }
    }

    #[test]
    fn only_statefulset_pods_with_claims_are_protected() {
        let pod = |name: &str, owner: &str, claim: Option<&str>| {
            let volumes: Vec<Value> = claim
                .map(|c| json!({"name": "data", "persistentVolumeClaim": {"claimName": c}}))
                .into_iter()
                .collect();
            json!({
                "metadata": {"name": name, "namespace": "db", "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": owner, "name": "x", "uid": "u", "controller": true}
                ]},
                "spec": {"volumes": volumes}
            })
        };
        let got = protected_pods(&[
            pod("pg-0", "StatefulSet", Some("data-pg-0")),
            pod("cache-0", "StatefulSet", None),
            pod("web-1", "ReplicaSet", Some("shared")),
        ]);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["db/pg-0"]);
        assert!(got["db/pg-0"].contains("data-pg-0"));
    }

    #[test]
    fn records_are_read_from_plan_json() {
        let plan = json!({"status": {"backups": [
            {"name": "b1", "namespace": "db", "pvcs": ["data-pg-0"], "verifiedAt": "2025-01-01T00:00:01.000100Z"},
            {"name": "b2", "namespace": "db", "pvcs": ["data-pg-1"]}
        ]}});
        let got = recorded_backups(&plan);
        assert_eq!(got.len(), 2);
        assert!(got[0].verified_at.is_some());
        assert_eq!(got[1].verified_at, None);
    }

    fn eviction(pod: &str, time: &str) -> AcceptedEviction {
        AcceptedEviction {
            pod: pod.into(),
            time: time.into(),
            user_agent: None,
            deleted: false,
        }
    }

    fn protected(entries: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        entries
            .iter()
            .map(|(p, c)| (p.to_string(), c.iter().map(|c| c.to_string()).collect()))
            .collect()
    }

    #[test]
    fn eviction_after_verification_is_fine_and_unprotected_pods_are_ignored() {
        let backups = [record(
            "db",
            &["data-pg-0"],
            Some("2025-01-01T00:00:01.000100Z"),
        )];
        let evictions = [
            eviction("db/pg-0", "2025-01-01T00:00:01.002Z"),
            eviction("db/web-1", "2025-01-01T00:00:00.000Z"),
        ];
        let p = protected(&[("db/pg-0", &["data-pg-0"])]);
        assert!(eviction_violations(&evictions, &p, &backups).is_empty());
    }

    fn snap(volume: &str, start: &str, uid: &str) -> Ec2Snapshot {
        Ec2Snapshot {
            snapshot_id: format!("snap-{volume}"),
            volume_id: volume.into(),
            start_time: start.parse().expect("test time"),
            tags: BTreeMap::from([(PLAN_UID_TAG.to_string(), uid.to_string())]),
            state: "pending".into(),
        }
    }

    /// A pod let go at an EBS snapshot is fine only when EC2 holds a snapshot of each of its EBS claims,
    /// of this plan, started before the eviction; a node-local claim still needs a verified backup.
    #[test]
    fn an_eviction_at_an_ec2_snapshot_of_the_plan_counts_only_for_ebs_claims() {
        let p = protected(&[
            ("db/pg-0", &["data-pg-0"]),
            ("db/pg-1", &["data-pg-1", "scratch-1"]),
        ]);
        let evidence = |snapshots: Vec<Ec2Snapshot>| EbsEvidence {
            claim_volumes: BTreeMap::from([
                ("db/data-pg-0".to_string(), "vol-a".to_string()),
                ("db/data-pg-1".to_string(), "vol-b".to_string()),
            ]),
            snapshots,
            plan_uids: BTreeSet::from(["uid-1".to_string()]),
            ..EbsEvidence::default()
        };
        let evictions = [eviction("db/pg-0", "2025-01-01T00:00:02.000Z")];
        let ok = evidence(vec![snap("vol-a", "2025-01-01T00:00:01Z", "uid-1")]);
        assert!(eviction_violations_with_snapshots(&evictions, &p, &[], &ok).is_empty());
        for bad in [
            evidence(vec![snap("vol-a", "2025-01-01T00:00:03Z", "uid-1")]),
            evidence(vec![snap("vol-a", "2025-01-01T00:00:01Z", "uid-other")]),
            evidence(vec![snap("vol-b", "2025-01-01T00:00:01Z", "uid-1")]),
            // A snapshot that ended in error holds nothing.
            evidence(vec![Ec2Snapshot {
                state: "error".into(),
                ..snap("vol-a", "2025-01-01T00:00:01Z", "uid-1")
            }]),
            EbsEvidence::default(),
        ] {
            assert_eq!(
                eviction_violations_with_snapshots(&evictions, &p, &[], &bad).len(),
                1,
                "{bad:?}"
            );
        }
        // The node-local claim of pg-1 has no snapshot to stand for it.
        let mixed = [eviction("db/pg-1", "2025-01-01T00:00:02.000Z")];
        let both = evidence(vec![snap("vol-b", "2025-01-01T00:00:01Z", "uid-1")]);
        let v = eviction_violations_with_snapshots(&mixed, &p, &[], &both);
        assert!(
            matches!(&v[..], [Violation::NotCovered { pvcs, .. }] if pvcs == &["scratch-1".to_string()]),
            "{v:?}"
        );
        let verified = [record("db", &["scratch-1"], Some("2025-01-01T00:00:01Z"))];
        assert!(eviction_violations_with_snapshots(&mixed, &p, &verified, &both).is_empty());
    }

    /// The soak's case: a pod's volume was cut by the plan of the node it just left; it started on its
    /// new node after that cut and was evicted there with no cut of its own. The older snapshot holds
    /// nothing it wrote on the new node, so it does not save it; a cut after the start does.
    #[test]
    fn a_snapshot_cut_before_the_pod_last_started_does_not_save_it() {
        let p = protected(&[("db/pg-0", &["data-pg-0"])]);
        let t = |s: &str| s.parse::<Timestamp>().expect("test time");
        let evidence = |snapshots: Vec<Ec2Snapshot>, starts: &[&str]| EbsEvidence {
            claim_volumes: BTreeMap::from([("db/data-pg-0".to_string(), "vol-a".to_string())]),
            snapshots,
            plan_uids: BTreeSet::from(["uid-1".to_string(), "uid-2".to_string()]),
            pod_starts: BTreeMap::from([(
                "db/pg-0".to_string(),
                starts.iter().map(|s| t(s)).collect(),
            )]),
            ..EbsEvidence::default()
        };
        let evictions = [eviction("db/pg-0", "2025-01-01T00:00:10.000Z")];
        let old_cut = snap("vol-a", "2025-01-01T00:00:01Z", "uid-1");
        let moved = ["2025-01-01T00:00:00Z", "2025-01-01T00:00:03Z"];
        let stale = evidence(vec![old_cut.clone()], &moved);
        assert_eq!(
            eviction_violations_with_snapshots(&evictions, &p, &[], &stale).len(),
            1,
            "the previous node's cut"
        );
        let fresh = evidence(
            vec![
                old_cut.clone(),
                snap("vol-a", "2025-01-01T00:00:05Z", "uid-2"),
            ],
            &moved,
        );
        assert!(eviction_violations_with_snapshots(&evictions, &p, &[], &fresh).is_empty());
        // A start after the eviction is another life of the pod: it does not move the bound.
        let later = evidence(
            vec![old_cut],
            &["2025-01-01T00:00:00Z", "2025-01-01T00:00:20Z"],
        );
        assert!(eviction_violations_with_snapshots(&evictions, &p, &[], &later).is_empty());
    }

    /// A pod let go at a CSI snapshot is fine only when its plan asked for it, the cut is of the claim's
    /// own volume and came before the eviction; a node-local claim still needs a verified backup.
    #[test]
    fn an_eviction_at_a_csi_snapshot_counts_only_when_the_plan_asked_and_the_cut_came_first() {
        let p = protected(&[
            ("db/pg-0", &["data-pg-0"]),
            ("db/pg-1", &["data-pg-1", "scratch-1"]),
        ]);
        let cut = |claim: &str, volume: &str, uid: &str, at: &str| CsiCutEvidence {
            claim: claim.into(),
            volume_handle: volume.into(),
            plan_uid: Some(uid.into()),
            cut_at: at.parse().expect("test time"),
        };
        let evidence = |cuts: Vec<CsiCutEvidence>, asked: &[&str]| EbsEvidence {
            claim_volumes: BTreeMap::from([
                ("db/data-pg-0".to_string(), "vol-a".to_string()),
                ("db/data-pg-1".to_string(), "vol-b".to_string()),
            ]),
            csi_cuts: cuts,
            snapshot_release_uids: asked.iter().map(|u| u.to_string()).collect(),
            ..EbsEvidence::default()
        };
        let evictions = [eviction("db/pg-0", "2025-01-01T00:00:02.000Z")];
        let good = cut("db/data-pg-0", "vol-a", "uid-1", "2025-01-01T00:00:01Z");
        let ok = evidence(vec![good.clone()], &["uid-1"]);
        assert!(eviction_violations_with_snapshots(&evictions, &p, &[], &ok).is_empty());
        for (why, bad) in [
            ("the plan did not ask", evidence(vec![good.clone()], &[])),
            (
                "another plan's cut",
                evidence(
                    vec![cut(
                        "db/data-pg-0",
                        "vol-a",
                        "uid-2",
                        "2025-01-01T00:00:01Z",
                    )],
                    &["uid-1"],
                ),
            ),
            (
                "cut after the eviction",
                evidence(
                    vec![cut(
                        "db/data-pg-0",
                        "vol-a",
                        "uid-1",
                        "2025-01-01T00:00:03Z",
                    )],
                    &["uid-1"],
                ),
            ),
            (
                "another volume",
                evidence(
                    vec![cut(
                        "db/data-pg-0",
                        "vol-z",
                        "uid-1",
                        "2025-01-01T00:00:01Z",
                    )],
                    &["uid-1"],
                ),
            ),
            (
                "another claim",
                evidence(
                    vec![cut(
                        "db/data-pg-1",
                        "vol-b",
                        "uid-1",
                        "2025-01-01T00:00:01Z",
                    )],
                    &["uid-1"],
                ),
            ),
        ] {
            assert_eq!(
                eviction_violations_with_snapshots(&evictions, &p, &[], &bad).len(),
                1,
                "{why}"
            );
        }
        let mixed = [eviction("db/pg-1", "2025-01-01T00:00:02.000Z")];
        let both = evidence(
            vec![cut(
                "db/data-pg-1",
                "vol-b",
                "uid-1",
                "2025-01-01T00:00:01Z",
            )],
            &["uid-1"],
        );
        let v = eviction_violations_with_snapshots(&mixed, &p, &[], &both);
        assert!(
            matches!(&v[..], [Violation::NotCovered { pvcs, .. }] if pvcs == &["scratch-1".to_string()]),
            "{v:?}"
        );
    }

    #[test]
    fn eviction_before_verification_or_without_backup_is_reported() {
        let backups = [record("db", &["data-pg-0"], Some("2025-01-01T00:00:02Z"))];
        let evictions = [
            eviction("db/pg-0", "2025-01-01T00:00:01.000Z"),
            eviction("db/pg-1", "2025-01-01T00:00:03.000Z"),
        ];
        let p = protected(&[("db/pg-0", &["data-pg-0"]), ("db/pg-1", &["data-pg-1"])]);
        let v = eviction_violations(&evictions, &p, &backups);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(matches!(&v[0], Violation::EvictedBeforeVerified { pod, .. } if pod == "db/pg-0"));
        assert!(
            matches!(&v[1], Violation::NotCovered { pod, pvcs, .. } if pod == "db/pg-1" && pvcs == &["data-pg-1"])
        );
    }

    #[test]
    fn every_claim_must_be_covered_and_unverified_backups_do_not_count() {
        let backups = [
            record("db", &["a"], Some("2025-01-01T00:00:00Z")),
            record("db", &["b"], None),
            record("other", &["b"], Some("2025-01-01T00:00:00Z")),
        ];
        let evictions = [eviction("db/pg-0", "2025-01-01T00:00:05.000Z")];
        let p = protected(&[("db/pg-0", &["a", "b"])]);
        let v = eviction_violations(&evictions, &p, &backups);
        assert!(
            matches!(v.as_slice(), [Violation::NotCovered { pvcs, .. }] if pvcs == &["b"]),
            "{v:?}"
        );
        assert!(v[0].to_string().contains("no verified backup covers"));
    }

    #[test]
    fn unreadable_times_are_violations() {
        let p = protected(&[("db/pg-0", &["a"])]);
        let v = eviction_violations(&[eviction("db/pg-0", "yesterday")], &p, &[]);
        assert!(matches!(v.as_slice(), [Violation::UnreadableTime { .. }]));
    }

    #[test]
    fn only_accepted_api_evictions_are_read_from_the_audit() {
        let entry = |source: &str, code: u16| AuditEntry {
            seq: 1,
            time: "2025-01-01T00:00:00.000Z".into(),
            source: source.into(),
            verb: "create".into(),
            resource: "pods/eviction".into(),
            namespace: Some("db".into()),
            name: Some("pg-0".into()),
            user_agent: None,
            code: Some(code),
            detail: serde_json::Value::Null,
        };
        let evicted = AuditEntry {
            source: "world".into(),
            verb: "evicted".into(),
            resource: "pods".into(),
            code: None,
            ..entry("world", 0)
        };
        // A 201 without the server's own eviction record is a Failure body, not an eviction.
        assert!(accepted_evictions(&[entry("api", 201)]).is_empty());
        let got = accepted_evictions(&[
            entry("api", 429),
            entry("world", 201),
            evicted,
            entry("api", 201),
            entry("api", 201),
        ]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].pod, "db/pg-0");
    }

    #[test]
    fn an_accepted_pod_delete_counts_as_the_pod_leaving() {
        let delete = |code: u16, name: Option<&str>| AuditEntry {
            seq: 1,
            time: "2025-01-01T00:00:03.000Z".into(),
            source: "api".into(),
            verb: "delete".into(),
            resource: "pods".into(),
            namespace: Some("db".into()),
            name: name.map(str::to_string),
            user_agent: Some("karpenter".into()),
            code: Some(code),
            detail: serde_json::Value::Null,
        };
        let audit = [
            delete(200, Some("pg-0")),
            delete(409, Some("pg-1")),
            // A collection delete names no pod.
            delete(200, None),
        ];
        let got = pods_removed(&audit);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].pod, "db/pg-0");
        let p = protected(&[("db/pg-0", &["data-pg-0"])]);
        let v = eviction_violations(&got, &p, &[]);
        assert!(matches!(v.as_slice(), [Violation::NotCovered { pod, .. }] if pod == "db/pg-0"));
        // The text says how it left and who asked: a DELETE passes no eviction gate.
        assert!(
            v[0].to_string().contains("was deleted by karpenter at"),
            "{}",
            v[0]
        );
        let backups = [record("db", &["data-pg-0"], Some("2025-01-01T00:00:02Z"))];
        assert!(eviction_violations(&got, &p, &backups).is_empty());
    }
}
