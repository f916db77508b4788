//! A Karpenter drift rollout of the 20 nodes of `drift-rollout`, and of the same grown to 200 nodes, by
//! Karpenter alone and guarded by snapdrain (issue "Scale and speed"). Guarded, each node waits for its verified backup, and Velero runs
//! one backup at a time, so the floor is the rollout's backups run back to back plus Karpenter's own
//! replacement time; the target is 1.5x that. Also reported: how long Velero sat idle while a Backup was
//! queued, from the audit log's Backup phases.
//!
//! One at a time is Velero's own queue: vmware-tanzu/velero `pkg/controller/backup_queue_controller.go`
//! `Reconcile` leaves a Backup `Queued` while `backupTracker.RunningCount() >= concurrentBackups`, and
//! `pkg/cmd/server/config/config.go` sets `--concurrent-backups` to `DefaultConcurrentBackups = 1`
//! (before 1.18 only one Backup could be InProgress at all: velero
//! `design/Implemented/concurrent-backup-processing.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use super::report::Report;
use super::sim::{audit_time, start_controller, start_scenario, wait_store};
use snapdrain_sim::apiserver::audit::AuditEntry;
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::apiserver::store::meta_str;
use snapdrain_sim::world::Timings;

const SECTION: &str = "rollout";
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(600);

/// Drift-rollout timings with Velero at 20 GiB/s, so 9 backups of 20-30 GiB take seconds, not minutes;
/// the ratio, not the absolute time, is the figure.
fn timings() -> Timings {
    Timings {
        pod_start: Duration::from_millis(200),
        pod_stop: Duration::from_millis(100),
        volume_detach: Duration::from_millis(100),
        instance_boot: Duration::from_secs(2),
        backup_mib_per_second: 20480.0,
        ebs_snapshot_mib_per_second: 0.0,
        ebs_snapshot_per_volume_interval: snapdrain_sim::ec2::PER_VOLUME_INTERVAL,
        backup_overhead: Duration::from_millis(300),
    }
}

struct Rollout {
    total: Duration,
    /// Sum of every Backup's InProgress -> done time: Velero's work, back to back.
    backups: Duration,
    backup_count: usize,
    /// Time during which some Backup was queued (created, not started) and none ran.
    velero_idle_while_queued: Duration,
    /// Backup attempts the plans gave up on, with the reason their status gives.
    failed_attempts: Vec<String>,
}

/// `drift-rollout` grown `scale` times: `20 * scale` nodes, and `scale` times the replicas of each
/// StatefulSet and Deployment, so each node carries what it carries in the 20-node scenario.
fn scenario(scale: u32) -> anyhow::Result<(snapdrain_sim::scenario::format::Scenario, String)> {
    let (mut scenario, label) = snapdrain_sim::scenario::resolve("drift-rollout")?;
    scenario.timeline.clear();
    if scale > 1 {
        for group in &mut scenario.nodes {
            group.count = Some(group.count.unwrap_or(1) * scale);
        }
        for set in &mut scenario.stateful_sets {
            set.replicas *= scale;
        }
        for d in &mut scenario.deployments {
            d.replicas *= scale;
        }
    }
    Ok((scenario, format!("{label} x{scale}")))
}

async fn run(guarded: bool, scale: u32) -> anyhow::Result<Rollout> {
    let (scenario, label) = scenario(scale)?;
    let b = start_scenario(scenario, &label, timings()).await?;
    let store = &b.cluster.store;
    wait_store(
        store,
        &ResKey::new("apps", "statefulsets"),
        "every StatefulSet ready",
        ROLLOUT_TIMEOUT,
        |sets| {
            !sets.is_empty()
                && sets
                    .iter()
                    .all(|s| s.pointer("/status/readyReplicas") == s.pointer("/spec/replicas"))
        },
    )
    .await?;
    let controller = match guarded {
        true => Some(start_controller(&b).await?),
        false => None,
    };
    if guarded {
        // The oracle's own rule of what is protected, not the product's.
        let pods: Vec<Value> = store
            .snapshot(&ResKey::core("pods"))
            .0
            .iter()
            .map(|p| (**p).clone())
            .collect();
        let protected: BTreeSet<String> = snapdrain_testkit::safety::protected_pods(&pods)
            .into_keys()
            .collect();
        wait_store(
            store,
            &ResKey::core("pods"),
            "every protected pod held",
            ROLLOUT_TIMEOUT,
            |pods| {
                let held = pods
                    .iter()
                    .filter(|p| {
                        protected.contains(&format!(
                            "{}/{}",
                            meta_str(p, "namespace").unwrap_or(""),
                            meta_str(p, "name").unwrap_or("")
                        ))
                    })
                    .filter(|p| {
                        p.pointer("/metadata/annotations/karpenter.sh~1do-not-disrupt")
                            == Some(&Value::from("true"))
                    })
                    .count();
                held == protected.len()
            },
        )
        .await?;
    }
    let old: BTreeSet<String> = store
        .snapshot(&ResKey::core("nodes"))
        .0
        .iter()
        .filter_map(|n| meta_str(n, "name").map(str::to_owned))
        .collect();
    let audit_from = b.cluster.audit.since(0).len() as u64;
    let started = Instant::now();
    snapdrain_testkit::karpenter::mark_all_drifted(&b.client)
        .await
        .context("marking the NodeClaims drifted")?;
    let done = wait_store(
        store,
        &ResKey::core("nodes"),
        "every drifted node replaced",
        ROLLOUT_TIMEOUT,
        |nodes| {
            !nodes
                .iter()
                .any(|n| meta_str(n, "name").is_some_and(|name| old.contains(name)))
        },
    )
    .await;
    if let Some(c) = controller {
        c.shutdown().await;
    }
    let total = done?.saturating_duration_since(started);
    let audit = b.cluster.audit.since(audit_from);
    let spans = backup_spans(&audit);
    let failed_attempts = store
        .snapshot(&ResKey::new("snapdrain.io", "disruptionplans"))
        .0
        .iter()
        .flat_map(|p| {
            p.pointer("/status/backups")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter(|b| b["phase"] != "Completed")
        .map(|b| b["message"].as_str().unwrap_or("no message").to_string())
        .collect();
    Ok(Rollout {
        failed_attempts,
        total,
        backups: spans.iter().map(|s| s.ran()).sum(),
        backup_count: spans.len(),
        velero_idle_while_queued: idle_while_queued(&spans),
    })
}

/// One Velero Backup's life, in milliseconds since the epoch.
#[derive(Clone, Debug, PartialEq)]
struct Span {
    queued: i64,
    started: i64,
    ended: i64,
}

impl Span {
    fn ran(&self) -> Duration {
        Duration::from_millis((self.ended - self.started).max(0) as u64)
    }
}

fn millis(e: &AuditEntry) -> Option<i64> {
    audit_time(e).map(|t| t.as_millisecond())
}

/// Each Backup that ran to an end: Queued, InProgress and its final phase (Velero's own phases, as
/// the simulated Velero records them).
fn backup_spans(audit: &[AuditEntry]) -> Vec<Span> {
    let mut queued: BTreeMap<String, i64> = BTreeMap::new();
    let mut started: BTreeMap<String, i64> = BTreeMap::new();
    let mut spans = Vec::new();
    for e in audit {
        let (Some(name), Some(at)) = (e.name.clone(), millis(e)) else {
            continue;
        };
        if e.source == "world" && e.resource == "backups.velero.io" {
            match e.detail["phase"].as_str() {
                // Velero 1.18's queue: a new Backup is Queued, then ReadyToStart, then InProgress.
                Some("Queued") => {
                    queued.entry(name).or_insert(at);
                }
                Some("InProgress") => {
                    started.insert(name, at);
                }
                Some("Completed" | "PartiallyFailed" | "Failed") => {
                    if let Some(s) = started.remove(&name) {
                        spans.push(Span {
                            queued: queued.get(&name).copied().unwrap_or(s),
                            started: s,
                            ended: at,
                        });
                    }
                }
                _ => {}
            }
        }
    }
    spans
}

/// Total time in which at least one Backup waited in the queue and none was running: Velero's one
/// worker left idle while a plan waited for it.
fn idle_while_queued(spans: &[Span]) -> Duration {
    // +1/-1 sweeps of "waiting" and "running" counts over every boundary.
    let mut points: Vec<(i64, i32, i32)> = Vec::new();
    for s in spans {
        points.push((s.queued, 1, 0));
        points.push((s.started, -1, 1));
        points.push((s.ended, 0, -1));
    }
    points.sort();
    let (mut waiting, mut running, mut idle, mut last) = (0, 0, 0i64, None);
    for (at, dw, dr) in points {
        if let Some(prev) = last
            && waiting > 0
            && running == 0
        {
            idle += at - prev;
        }
        waiting += dw;
        running += dr;
        last = Some(at);
    }
    Duration::from_millis(idle.max(0) as u64)
}

/// The rollout of `drift-rollout` (20 nodes) and of it grown tenfold (200 nodes), each by Karpenter
/// alone and guarded, in one bench run.
pub async fn drift(report: &mut Report) -> anyhow::Result<()> {
    for scale in [1, 10] {
        rollout(scale, report).await?;
    }
    Ok(())
}

async fn rollout(scale: u32, report: &mut Report) -> anyhow::Result<()> {
    let alone = run(false, scale).await?;
    let guarded = run(true, scale).await?;
    let nodes = 20 * scale;
    let secs = |d: Duration| d.as_secs_f64();
    report
        .add(
            SECTION,
            format!("{nodes}-node drift rollout, Karpenter alone"),
            secs(alone.total),
            "s",
        )
        .note = Some("drift marked -> every drifted node gone; budget 20%".into());
    report
        .add(
            SECTION,
            format!("{nodes}-node drift rollout, guarded by snapdrain"),
            secs(guarded.total),
            "s",
        )
        .note = Some(format!(
        "{} Velero backups, {:.2} s of Velero work back to back; {} attempt(s) retried{}",
        guarded.backup_count,
        secs(guarded.backups),
        guarded.failed_attempts.len(),
        guarded
            .failed_attempts
            .first()
            .map(|m| format!(" (first: {m})"))
            .unwrap_or_default()
    ));
    let floor = guarded.backups + alone.total;
    let f = report.add(
        SECTION,
        format!("{nodes}-node guarded rollout / (backups back to back + Karpenter alone)"),
        secs(guarded.total) / secs(floor),
        "x",
    );
    f.target = Some("<= 1.5x".into());
    f.note = Some(format!("floor {:.2} s", secs(floor)));
    let f = report.add(
        SECTION,
        format!("Velero idle while a Backup was queued ({nodes}-node guarded rollout)"),
        secs(guarded.velero_idle_while_queued),
        "s",
    );
    f.target = Some("0 s".into());
    f.note = Some("from the audit log's Backup phases (ms timestamps)".into());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_counts_only_time_with_a_queue_and_no_running_backup() {
        // b1 runs 0-10; b2 queued at 5 but starts only at 15 (idle 10-15); b3 queued at 30, runs 30-40.
        let spans = [
            Span {
                queued: 0,
                started: 0,
                ended: 10,
            },
            Span {
                queued: 5,
                started: 15,
                ended: 20,
            },
            Span {
                queued: 30,
                started: 30,
                ended: 40,
            },
        ];
        assert_eq!(idle_while_queued(&spans), Duration::from_millis(5));
        assert_eq!(
            spans.iter().map(Span::ran).sum::<Duration>(),
            Duration::from_millis(25)
        );
    }
}
