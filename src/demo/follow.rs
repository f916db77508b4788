//! Following a plan live: the plan by watch (phase, backups, verification, evictions, blocked messages,
//! replacement) and the simulator's audit log (each eviction the API server accepted or refused, instances
//! terminated, nodes joining). The [`Narrator`] turns changes into lines and is pure, so it is unit-tested.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::broadcast;

use super::printer::Printer;
use snapdrain::api::DisruptionPlan;
use snapdrain::api::status::{DisruptionPlanStatus, PlanPhase};
use snapdrain_sim::apiserver::audit::AuditEntry;

/// Remembers what was already told, so each change is told once.
#[derive(Debug, Default)]
pub struct Narrator {
    /// Protected pods (`ns/name`), to mark their evictions.
    protected: BTreeSet<String>,
    phase: Option<PlanPhase>,
    message: Option<String>,
    /// Backup name → (phase, verified).
    backups: BTreeMap<String, (Option<String>, bool)>,
    /// Node → (evicted, blocked message).
    nodes: BTreeMap<String, (u32, Option<String>)>,
    launched: BTreeSet<String>,
    ready: BTreeSet<String>,
    /// Pods whose refused eviction was already told (retries are not repeated).
    refused: BTreeSet<String>,
    /// Each phase as first seen by the watch, with the time since the plan was submitted.
    pub transitions: Vec<(PlanPhase, Duration)>,
}

impl Narrator {
    pub fn new(protected: BTreeSet<String>) -> Self {
        Self {
            protected,
            ..Self::default()
        }
    }

    /// Lines for what changed in the plan's status since the last call.
    pub fn plan_lines(&mut self, status: &DisruptionPlanStatus) -> Vec<String> {
        let mut lines = Vec::new();
        for b in &status.backups {
            let seen = self.backups.get(&b.name).cloned();
            let (old_phase, old_verified) = seen.clone().unwrap_or((None, false));
            if seen.is_none() {
                let reused = if b.reused { " (reused)" } else { "" };
                lines.push(format!(
                    "backup {}{reused}: namespace {}, PVCs {}",
                    b.name,
                    b.namespace,
                    b.pvcs.join(", ")
                ));
            }
            if b.phase.is_some() && b.phase != old_phase {
                lines.push(format!(
                    "backup {}: Velero phase {}",
                    b.name,
                    b.phase.as_deref().unwrap_or_default()
                ));
            }
            if b.verified && !old_verified {
                let bytes: u64 = b.verified_objects.iter().map(|o| o.size).sum();
                lines.push(format!(
                    "backup {}: verified in the bucket ({} objects, {})",
                    b.name,
                    b.verified_objects.len(),
                    human_bytes(bytes)
                ));
            }
            if let Some(err) = &b.verification_error
                && seen.as_ref().is_none_or(|(_, v)| !v)
            {
                lines.push(format!("backup {}: verification failed: {err}", b.name));
            }
            self.backups
                .insert(b.name.clone(), (b.phase.clone(), b.verified));
        }
        for n in &status.nodes {
            let (old_evicted, old_blocked) = self.nodes.get(&n.name).cloned().unwrap_or_default();
            if n.pods_evicted != old_evicted && n.pods_total > 0 {
                lines.push(format!(
                    "node {}: {}/{} pods evicted",
                    n.name, n.pods_evicted, n.pods_total
                ));
            }
            if n.blocked_by != old_blocked
                && let Some(b) = &n.blocked_by
            {
                lines.push(format!("node {}: blocked: {b}", n.name));
            }
            self.nodes
                .insert(n.name.clone(), (n.pods_evicted, n.blocked_by.clone()));
            if let Some(r) = &n.replacement {
                for id in &r.instance_ids {
                    if self.launched.insert(id.clone()) {
                        lines.push(format!(
                            "replacement for {}: launched instance {id}",
                            n.name
                        ));
                    }
                }
                if r.ready
                    && let Some(name) = &r.node_name
                    && self.ready.insert(name.clone())
                {
                    lines.push(format!("replacement for {}: node {name} is Ready", n.name));
                }
            }
        }
        if self.phase != Some(status.phase) {
            let from = self.phase.map_or("(new)", PlanPhase::as_str);
            let mut line = format!("phase {from} → {}", status.phase);
            // A message carried over from the previous phase was already told.
            if let Some(m) = &status.message
                && status.message != self.message
            {
                line.push_str(&format!(": {m}"));
            }
            lines.push(line);
            self.phase = Some(status.phase);
        } else if status.message != self.message
            && let Some(m) = &status.message
        {
            lines.push(format!("  {m}"));
        }
        self.message = status.message.clone();
        lines
    }

    /// A line for an audit entry worth telling, if it is one.
    pub fn audit_line(&mut self, e: &AuditEntry) -> Option<String> {
        let name = e.name.as_deref().unwrap_or_default();
        let pod = format!("{}/{name}", e.namespace.as_deref().unwrap_or_default());
        match (e.source.as_str(), e.resource.as_str(), e.verb.as_str()) {
            ("api", "pods/eviction", _) if e.code == Some(201) => {
                let what = if self.protected.contains(&pod) {
                    "protected pod"
                } else {
                    "pod"
                };
                Some(format!("evicted {what} {pod}"))
            }
            ("api", "pods/eviction", _) if e.code == Some(429) => self
                .refused
                .insert(pod.clone())
                .then(|| format!("eviction of {pod} refused (429, PDB); retrying with backoff")),
            ("api", "nodes", "delete") if e.code == Some(200) => {
                Some(format!("node {name} deleted"))
            }
            ("api", "nodeclaims.karpenter.sh", "delete") if e.code == Some(200) => Some(format!(
                "NodeClaim {name} deleted; Karpenter terminates its instance"
            )),
            ("world", "instances", "instance-terminated") => {
                Some(format!("EC2 instance {name} terminated"))
            }
            ("world", "nodes", "node-registered") => Some(format!("node {name} registered")),
            _ => None,
        }
    }
}

/// How following ended.
pub enum Ending {
    /// The plan reached a terminal phase.
    Finished(Box<DisruptionPlan>),
    /// Time ran out; the last plan seen, if any.
    TimedOut(Option<Box<DisruptionPlan>>),
}

/// Follows plan `name` until it is terminal or `timeout` passes.
pub async fn follow(
    client: &Client,
    name: &str,
    audit: &mut broadcast::Receiver<AuditEntry>,
    narrator: &mut Narrator,
    timeout: Duration,
    printer: &mut Printer<'_>,
) -> anyhow::Result<Ending> {
    let plans: Api<DisruptionPlan> = Api::all(client.clone());
    let wc = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(plans, wc).default_backoff().applied_objects();
    let mut stream = std::pin::pin!(stream);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last: Option<Box<DisruptionPlan>> = None;
    let mut audit_open = true;
    loop {
        tokio::select! {
            // Audit entries first: an eviction is told before the status that counts it.
            biased;
            entry = audit.recv(), if audit_open => match entry {
                Ok(e) => {
                    if let Some(line) = narrator.audit_line(&e) {
                        printer.event(line)?;
                    }
                }
                // Missing some audit lines only makes the story shorter; the status still tells it.
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => audit_open = false,
            },
            item = stream.next() => {
                let plan = match item {
                    Some(Ok(p)) => p,
                    // The watcher retries with backoff by itself; an error is only worth a line.
                    Some(Err(e)) => {
                        printer.event(format!("(watch of plan {name} interrupted: {e}; resuming)"))?;
                        continue;
                    }
                    None => anyhow::bail!("the watch of plan {name} ended unexpectedly"),
                };
                if plan.name_any() != name {
                    continue;
                }
                let status = plan.status.clone().unwrap_or_default();
                if narrator.phase != Some(status.phase) {
                    narrator.transitions.push((status.phase, printer.elapsed()));
                }
                for line in narrator.plan_lines(&status) {
                    printer.event(line)?;
                }
                printer.status(format!("plan {name}: {}", status.phase));
                if status.phase.is_terminal() {
                    return Ok(Ending::Finished(Box::new(plan)));
                }
                last = Some(Box::new(plan));
            },
            _ = tokio::time::sleep_until(deadline) => return Ok(Ending::TimedOut(last)),
        }
    }
}

/// Drains audit entries already queued (e.g. the last evictions), so the story is complete.
pub fn drain_audit(
    audit: &mut broadcast::Receiver<AuditEntry>,
    narrator: &mut Narrator,
    printer: &mut Printer<'_>,
) -> anyhow::Result<()> {
    loop {
        match audit.try_recv() {
            Ok(e) => {
                if let Some(line) = narrator.audit_line(&e) {
                    printer
                        .event(line)
                        .context("cannot write the demo output")?;
                }
            }
            Err(broadcast::error::TryRecvError::Lagged(_)) => {}
            Err(_) => return Ok(()),
        }
    }
}

/// `1.2 KiB`, `3.0 MiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapdrain::api::status::{BackupRecord, NodeProgress, ReplacementProgress, VerifiedObject};

    #[test]
    fn each_change_is_told_once() {
        let mut n = Narrator::new(BTreeSet::new());
        let mut s = DisruptionPlanStatus {
            phase: PlanPhase::BackingUp,
            backups: vec![BackupRecord {
                name: "b1".into(),
                namespace: "shop".into(),
                pvcs: vec!["data-pg-0".into()],
                phase: Some("InProgress".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let first = n.plan_lines(&s);
        assert_eq!(first.len(), 3, "{first:?}");
        assert!(first[2].starts_with("phase (new) → BackingUp"));
        assert!(n.plan_lines(&s).is_empty());
        s.phase = PlanPhase::Verifying;
        s.backups[0].phase = Some("Completed".into());
        s.backups[0].verified = true;
        s.backups[0].verified_objects = vec![VerifiedObject {
            key: "k".into(),
            size: 2048,
        }];
        let next = n.plan_lines(&s);
        assert_eq!(
            next,
            vec![
                "backup b1: Velero phase Completed",
                "backup b1: verified in the bucket (1 objects, 2.0 KiB)",
                "phase BackingUp → Verifying",
            ]
        );
        s.message = Some("verifying".into());
        s.phase = PlanPhase::Cordoning;
        assert_eq!(
            n.plan_lines(&s),
            vec!["phase Verifying → Cordoning: verifying"]
        );
        s.phase = PlanPhase::Draining;
        assert_eq!(n.plan_lines(&s), vec!["phase Cordoning → Draining"]);
        s.nodes = vec![NodeProgress {
            name: "n1".into(),
            pods_total: 4,
            pods_evicted: 2,
            blocked_by: Some("shop/pg-1: PDB".into()),
            replacement: Some(ReplacementProgress {
                instance_ids: vec!["i-1".into()],
                node_name: Some("n2".into()),
                ready: true,
                ..Default::default()
            }),
            ..Default::default()
        }];
        let lines = n.plan_lines(&s);
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines[3].contains("node n2 is Ready"));
    }

    #[test]
    fn audit_lines_mark_protected_pods_and_tell_refusals_once() {
        let mut n = Narrator::new(["shop/pg-0".to_string()].into());
        let entry = |code: u16, name: &str| AuditEntry {
            seq: 1,
            time: String::new(),
            source: "api".into(),
            verb: "create".into(),
            resource: "pods/eviction".into(),
            namespace: Some("shop".into()),
            name: Some(name.into()),
            user_agent: None,
            code: Some(code),
            detail: serde_json::Value::Null,
        };
        assert_eq!(
            n.audit_line(&entry(201, "pg-0")).as_deref(),
            Some("evicted protected pod shop/pg-0")
        );
        assert_eq!(
            n.audit_line(&entry(201, "web")).as_deref(),
            Some("evicted pod shop/web")
        );
        assert!(n.audit_line(&entry(429, "pg-1")).is_some());
        assert!(n.audit_line(&entry(429, "pg-1")).is_none());
    }

    #[test]
    fn bytes_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024), "3.0 MiB");
    }
}
