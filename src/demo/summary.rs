//! The demo's closing report: backups and what the bucket holds, pods evicted, the instance terminated,
//! the replacement as the simulator booted it, time per step, and the safety check from the audit log.
//! [`Report`] is plain data (tests read it); [`Report::lines`] renders it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::follow::human_bytes;
use super::plan::REPLACEMENT_LABEL;
use super::preview::NodeView;
use snapdrain::api::DisruptionPlan;
use snapdrain::api::status::PlanPhase;
use snapdrain::api::velero::BackupStorageLocation;
use snapdrain_sim::SimCluster;
use snapdrain_sim::ec2::{InstanceEvent, InstanceState};
use snapdrain_sim::world::ec2_nodes::SYSCTLS_ANNOTATION;
use snapdrain_testkit::safety::{
    Violation, accepted_evictions, eviction_violations, recorded_backups,
};

#[derive(Clone, Debug, PartialEq)]
pub struct BackupSummary {
    pub name: String,
    pub namespace: String,
    pub pvcs: Vec<String>,
    pub phase: Option<String>,
    pub verified: bool,
    pub verified_at: Option<String>,
    /// `(key, size)` as checked in the bucket.
    pub objects: Vec<(String, u64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ReplacementSummary {
    pub instance_ids: Vec<String>,
    pub node_name: Option<String>,
    pub ready: bool,
    /// The plan's labels as found on the new Node.
    pub labels: Vec<(String, String)>,
    /// `key=value:Effect`.
    pub taints: Vec<String>,
    /// Kernel sysctls the host applied from its user data.
    pub sysctls: Vec<(String, String)>,
}

/// Everything the summary says, as data.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub plan: String,
    pub node: String,
    /// None when the plan was never seen (it timed out before any status).
    pub phase: Option<PlanPhase>,
    pub message: Option<String>,
    pub timed_out: bool,
    /// `s3://bucket/prefix` of the BackupStorageLocation.
    pub bucket: Option<String>,
    pub backups: Vec<BackupSummary>,
    /// `ns/name` of every pod whose eviction the API server accepted, protected ones marked.
    pub evicted: Vec<(String, bool)>,
    /// `(instance id, state)` of the replaced node's instance.
    pub instance: Option<(String, String)>,
    pub replacement: Option<ReplacementSummary>,
    /// Seconds per phase as the controller recorded them (`status.stepTimings`), in phase order.
    pub step_timings: Vec<(String, f64)>,
    /// Seconds per phase as the demo watched the transitions.
    pub observed_steps: Vec<(String, f64)>,
    pub audit_entries: usize,
    pub violations: Vec<Violation>,
    /// From the first verification to the first eviction of a protected pod.
    pub safety_margin: Option<Duration>,
    /// From plan submission to the end.
    pub elapsed: Duration,
}

impl Report {
    /// Why the demo failed, or None when the plan Completed and the promise held.
    pub fn failure(&self) -> Option<String> {
        let mut problems = Vec::new();
        if self.timed_out {
            problems.push(format!(
                "plan {} did not finish within the time allowed (last phase {}: {})",
                self.plan,
                self.phase.map_or("none", PlanPhase::as_str),
                self.message.as_deref().unwrap_or("no message")
            ));
        } else if self.phase != Some(PlanPhase::Completed) {
            problems.push(format!(
                "plan {} ended {}: {}",
                self.plan,
                self.phase.map_or("without a status", PlanPhase::as_str),
                self.message.as_deref().unwrap_or("no message")
            ));
        }
        if !self.violations.is_empty() {
            let v: Vec<String> = self.violations.iter().map(ToString::to_string).collect();
            problems.push(format!("safety check failed: {}", v.join("; ")));
        }
        (!problems.is_empty()).then(|| problems.join("\n"))
    }

    pub fn lines(&self) -> Vec<String> {
        let mut l = vec![String::new(), "Summary".to_string()];
        let phase = self.phase.map_or("unknown", PlanPhase::as_str);
        let outcome = if self.timed_out {
            format!(
                "still {phase} after {:.2}s (timed out)",
                self.elapsed.as_secs_f64()
            )
        } else {
            format!("{phase} in {:.2}s", self.elapsed.as_secs_f64())
        };
        l.push(format!("  plan            {} ({outcome})", self.plan));
        if let Some(m) = &self.message
            && self.phase != Some(PlanPhase::Completed)
        {
            l.push(format!("                  {m}"));
        }
        if self.backups.is_empty() {
            l.push("  backups         none (no protected pods on the node)".into());
        }
        for (i, b) in self.backups.iter().enumerate() {
            let head = if i == 0 {
                "  backups         "
            } else {
                "                  "
            };
            let state = match (&b.phase, b.verified) {
                (Some(p), true) => format!("{p}, verified"),
                (Some(p), false) => format!("{p}, NOT verified"),
                (None, _) => "not started".into(),
            };
            let at = b
                .verified_at
                .as_deref()
                .map(|t| format!(" at {t}"))
                .unwrap_or_default();
            l.push(format!("{head}{} ({state}{at})", b.name));
            l.push(format!(
                "                    namespace {}, PVCs: {}",
                b.namespace,
                b.pvcs.join(", ")
            ));
            for (key, size) in &b.objects {
                let place = match &self.bucket {
                    Some(bucket) => format!("s3://{}/{key}", bucket_name(bucket)),
                    None => key.clone(),
                };
                l.push(format!(
                    "                    {:>9}  {place}",
                    human_bytes(*size)
                ));
            }
        }
        let protected = self.evicted.iter().filter(|(_, p)| *p).count();
        l.push(format!(
            "  pods evicted    {} ({protected} protected)",
            self.evicted.len()
        ));
        for (pod, is_protected) in &self.evicted {
            let mark = if *is_protected { "  (protected)" } else { "" };
            l.push(format!("                    {pod}{mark}"));
        }
        match &self.instance {
            Some((id, state)) => l.push(format!(
                "  instance        {id} of node {}: {state}",
                self.node
            )),
            None => l.push(format!(
                "  instance        node {} has no EC2 instance id",
                self.node
            )),
        }
        match &self.replacement {
            None => l.push("  replacement     none".into()),
            Some(r) => {
                let node = r.node_name.as_deref().unwrap_or("(no node yet)");
                let ready = if r.ready { "Ready" } else { "NOT Ready" };
                l.push(format!(
                    "  replacement     instance {} → node {node} ({ready})",
                    r.instance_ids.join(", ")
                ));
                let labels: Vec<String> =
                    r.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                l.push(format!("                    labels:  {}", or_none(&labels)));
                l.push(format!(
                    "                    taints:  {}",
                    or_none(&r.taints)
                ));
                let sysctls: Vec<String> =
                    r.sysctls.iter().map(|(k, v)| format!("{k}={v}")).collect();
                l.push(format!(
                    "                    sysctls: {}",
                    or_none(&sysctls)
                ));
            }
        }
        let seconds = |steps: &[(String, f64)]| -> Vec<String> {
            steps.iter().map(|(p, s)| format!("{p} {s:.2}s")).collect()
        };
        l.push(format!(
            "  time per step   {} (watched)",
            or_none(&seconds(&self.observed_steps))
        ));
        l.push(format!(
            "                  {} (status.stepTimings)",
            or_none(&seconds(&self.step_timings))
        ));
        if self.violations.is_empty() {
            let margin = self
                .safety_margin
                .map(|m| {
                    format!(
                        "; first protected eviction {:.1} ms after the first verification",
                        m.as_secs_f64() * 1000.0
                    )
                })
                .unwrap_or_default();
            l.push(format!(
                "  safety check    PASSED: the audit log ({} entries) shows {} accepted eviction(s), {protected} of protected pods,",
                self.audit_entries,
                self.evicted.len()
            ));
            l.push(format!(
                "                  each after a verified backup covering the pod's PVCs{margin}"
            ));
        } else {
            l.push(format!(
                "  safety check    FAILED: {} violation(s)",
                self.violations.len()
            ));
            for v in &self.violations {
                l.push(format!("                    {v}"));
            }
        }
        l
    }
}

fn or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// The bucket alone from `s3://bucket/prefix` (verified keys already carry the prefix).
fn bucket_name(location: &str) -> &str {
    location
        .trim_start_matches("s3://")
        .split('/')
        .next()
        .unwrap_or(location)
}

/// What the report needs besides the plan.
pub struct Inputs<'a> {
    pub cluster: &'a SimCluster,
    pub client: &'a Client,
    pub plan_name: &'a str,
    pub node: &'a NodeView,
    pub protected: &'a BTreeMap<String, BTreeSet<String>>,
    pub plan: Option<&'a DisruptionPlan>,
    pub timed_out: bool,
    pub elapsed: Duration,
    /// Phases in the order the watch saw them, with the time since submission.
    pub transitions: &'a [(PlanPhase, Duration)],
}

pub async fn gather(i: Inputs<'_>) -> Report {
    let status = i.plan.and_then(|p| p.status.clone()).unwrap_or_default();
    let velero_ns = i.plan.map_or("velero".to_string(), |p| {
        p.spec.backup.velero_namespace.clone()
    });
    // The location Velero resolved into the Backups, else the plan's, else the name `velero install` uses.
    let bsl_name = i
        .plan
        .and_then(|p| {
            let resolved = p
                .status
                .as_ref()
                .and_then(|s| s.backups.iter().find_map(|b| b.storage_location.clone()));
            resolved.or_else(|| p.spec.backup.storage_location.clone())
        })
        .unwrap_or_else(|| "default".to_string());
    let bucket = Api::<BackupStorageLocation>::namespaced(i.client.clone(), &velero_ns)
        .get_opt(&bsl_name)
        .await
        .ok()
        .flatten()
        .map(|b| {
            let os = b.spec.object_storage;
            match os.prefix.filter(|p| !p.is_empty()) {
                Some(prefix) => format!("s3://{}/{prefix}", os.bucket),
                None => format!("s3://{}", os.bucket),
            }
        });
    let backups = status
        .backups
        .iter()
        .map(|b| BackupSummary {
            name: b.name.clone(),
            namespace: b.namespace.clone(),
            pvcs: b.pvcs.clone(),
            phase: b.phase.clone(),
            verified: b.verified,
            verified_at: b.verified_at.as_ref().map(|t| t.0.to_string()),
            objects: b
                .verified_objects
                .iter()
                .map(|o| (o.key.clone(), o.size))
                .collect(),
        })
        .collect();
    let audit = i.cluster.audit.since(0);
    let evictions = accepted_evictions(&audit);
    let mut seen = BTreeSet::new();
    let evicted: Vec<(String, bool)> = evictions
        .iter()
        .filter(|e| seen.insert(e.pod.clone()))
        .map(|e| (e.pod.clone(), i.protected.contains_key(&e.pod)))
        .collect();
    // The oracle reads the records from the plan's JSON, not through snapdrain's types. Without a plan
    // there are no records, so every protected eviction is a violation.
    let recorded = i
        .plan
        .and_then(|p| serde_json::to_value(p).ok())
        .map(|p| recorded_backups(&p))
        .unwrap_or_default();
    let violations = eviction_violations(&evictions, i.protected, &recorded);
    let first_verified = status
        .backups
        .iter()
        .filter_map(|b| b.verified_at.as_ref().map(|t| t.0))
        .min();
    let first_protected_eviction = evictions
        .iter()
        .filter(|e| i.protected.contains_key(&e.pod))
        .filter_map(|e| e.time.parse::<jiff::Timestamp>().ok())
        .min();
    let safety_margin = match (first_verified, first_protected_eviction) {
        (Some(v), Some(e)) if e > v => e.duration_since(v).try_into().ok(),
        _ => None,
    };
    let instance = match &i.node.instance_id {
        Some(id) => Some((id.clone(), instance_state(i.cluster, id).await)),
        None => None,
    };
    let replacement = match status.nodes.first().and_then(|n| n.replacement.clone()) {
        Some(r) => Some(replacement_summary(i.client, r).await),
        None => None,
    };
    let order = PlanPhase::ALL;
    let step_timings = order
        .iter()
        .filter_map(|p| {
            status
                .step_timings
                .get(p.as_str())
                .map(|s| (p.as_str().to_string(), *s))
        })
        .collect();
    Report {
        plan: i.plan_name.to_string(),
        node: i.node.name.clone(),
        phase: i.plan.map(|_| status.phase),
        message: status.message.clone(),
        timed_out: i.timed_out,
        bucket,
        backups,
        evicted,
        instance,
        replacement,
        step_timings,
        observed_steps: observed_steps(i.transitions, i.elapsed),
        audit_entries: audit.len(),
        violations,
        safety_margin,
        elapsed: i.elapsed,
    }
}

/// How long each watched phase lasted: until the next one was seen (the last, until `end`).
pub fn observed_steps(transitions: &[(PlanPhase, Duration)], end: Duration) -> Vec<(String, f64)> {
    transitions
        .iter()
        .enumerate()
        .filter(|(_, (phase, _))| !phase.is_terminal())
        .map(|(i, (phase, start))| {
            let until = transitions.get(i + 1).map_or(end, |(_, t)| *t);
            (
                phase.as_str().to_string(),
                until.saturating_sub(*start).as_secs_f64(),
            )
        })
        .collect()
}

/// The instance's state in the EC2 simulator. Karpenter terminates it asynchronously after the NodeClaim
/// is deleted, so a still shutting-down instance gets a few seconds to finish (watched, not polled).
async fn instance_state(cluster: &SimCluster, id: &str) -> String {
    let Some(ec2) = cluster.ec2.as_ref() else {
        return "unknown (no EC2 endpoint)".into();
    };
    // Subscribe before reading the state, so a termination in between is not missed.
    let mut events = ec2.subscribe();
    let state = |ec2: &snapdrain_sim::ec2::Ec2Sim| {
        ec2.instance(id)
            .map_or("unknown to EC2".to_string(), |i| i.state.name().to_string())
    };
    if ec2
        .instance(id)
        .is_none_or(|i| i.state == InstanceState::Terminated)
    {
        return state(ec2);
    }
    let wait = async {
        loop {
            match events.recv().await {
                Ok(InstanceEvent::Terminated { id: t }) if t == id => return,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), wait).await;
    state(ec2)
}

async fn replacement_summary(
    client: &Client,
    r: snapdrain::api::status::ReplacementProgress,
) -> ReplacementSummary {
    let node = match &r.node_name {
        Some(name) => Api::<Node>::all(client.clone())
            .get_opt(name)
            .await
            .ok()
            .flatten(),
        None => None,
    };
    let labels = node
        .as_ref()
        .map(|n| {
            n.labels()
                .iter()
                .filter(|(k, _)| k.as_str() == REPLACEMENT_LABEL.0)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let taints = node
        .as_ref()
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .iter()
        .map(|t| {
            format!(
                "{}={}:{}",
                t.key,
                t.value.as_deref().unwrap_or_default(),
                t.effect
            )
        })
        .collect();
    let sysctls = node
        .as_ref()
        .and_then(|n| n.annotations().get(SYSCTLS_ANNOTATION).cloned())
        .and_then(|json| serde_json::from_str::<BTreeMap<String, serde_json::Value>>(&json).ok())
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), str::to_string)))
        .collect();
    ReplacementSummary {
        instance_ids: r.instance_ids,
        node_name: r.node_name,
        ready: r.ready,
        labels,
        taints,
        sysctls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watched_steps_last_until_the_next_phase() {
        let ms = Duration::from_millis;
        let t = [
            (PlanPhase::Pending, ms(0)),
            (PlanPhase::BackingUp, ms(100)),
            (PlanPhase::Draining, ms(1100)),
            (PlanPhase::Completed, ms(1600)),
        ];
        let steps = observed_steps(&t, ms(1700));
        let names: Vec<&str> = steps.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["Pending", "BackingUp", "Draining"]);
        assert!((steps[1].1 - 1.0).abs() < 1e-9 && (steps[2].1 - 0.5).abs() < 1e-9);
    }

    #[test]
    fn failure_names_the_phase_and_the_violations() {
        let report = Report {
            plan: "p".into(),
            node: "n".into(),
            phase: Some(PlanPhase::Failed),
            message: Some("backup failed".into()),
            timed_out: false,
            bucket: None,
            backups: Vec::new(),
            evicted: Vec::new(),
            instance: None,
            replacement: None,
            step_timings: Vec::new(),
            observed_steps: Vec::new(),
            audit_entries: 0,
            violations: vec![Violation::UnreadableTime {
                pod: "a/b".into(),
                time: "x".into(),
            }],
            safety_margin: None,
            elapsed: Duration::ZERO,
        };
        let why = report.failure().unwrap_or_default();
        assert!(why.contains("ended Failed: backup failed") && why.contains("safety check failed"));
        assert!(
            report
                .lines()
                .iter()
                .any(|l| l.contains("FAILED: 1 violation"))
        );
    }
}
