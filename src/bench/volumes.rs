//! `snapdrain bench --only volumes`: the fastest safe backup for each kind of volume (issue "The fastest
//! safe backup"), each against its physical limit:
//! - 500 GiB on EBS under `releaseNetworkVolumesAt: Snapshot`: the pod is released once Velero's CSI
//!   snapshot is cut, and the backup is verified once the data mover has moved the bytes; the limit is
//!   what moving them must take (Velero's fixed overhead plus bytes / throughput);
//! - 500 GiB on a node's local NVMe: a file-system copy, the plan against its limit (the copy, the
//!   slowest pod stop and the sequential API round trips, as `limit.rs` counts them);
//! - a node with an EBS and a local volume: each backed up its own way (CSI data mover, file-system copy);
//! - a second backup of a 500 GiB EBS volume with 1% changed, against the first (kopia moves the change);
//! - a spot interruption (EC2's two minutes) of a node with 500 GiB on EBS, with Velero at the world's
//!   default 2 GiB/s (250 s for the data, more than the notice): every volume must end protected, judged
//!   by the safety oracle from what the simulated EC2 and CSI driver themselves hold.
//!
//! The simulated EBS CSI driver gives a snapshot its handle at once, as EC2's CreateSnapshot answers at
//! once with the snapshot id; on a real cluster the external-snapshotter's reconcile and the driver's
//! call add seconds, and `readyToUse` (EC2 `completed`) takes as long as EBS needs for the changed blocks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use super::report::Report;
use super::sim::{Bench, PodsGone, on_node, owned_by, start_cluster, start_controller, wait_store};
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::scenario::timeline::Action;
use snapdrain_sim::world::Timings;
use snapdrain_testkit::safety;
use snapdrain_testkit::volumes::{LocalWorkload, ebs_snapshot_class, local_workload};

const SECTION: &str = "volumes";
/// The data mover's and the node-agent's throughput in the world of the first three measurements: 8 GiB/s
/// keeps 500 GiB to about a minute; the ratios do not depend on it.
const DATA_MIB_PER_SECOND: f64 = 8192.0;
const GIB: u64 = 1 << 30;
/// The longest one measurement may wait for a state.
const LIMIT: Duration = Duration::from_secs(600);
/// The steps of an Execute plan that wait on the API server in turn (as `limit.rs`).
const SEQUENTIAL_ROUND_TRIPS: u32 = 6;

/// Three nodes with one 500 GiB StatefulSet replica each (3 CPUs a replica on 4-CPU nodes keeps them
/// apart); the simulated EBS CSI driver provisions the claims.
const EBS_500: &str = r#"
name: bench-volumes-ebs
description: Three nodes, one 500 GiB EBS-backed StatefulSet replica on each.
materialize: true
nodePools:
  - name: default
    consolidationPolicy: WhenEmpty
    consolidateAfter: 1h
nodes:
  - count: 3
    instanceType: m6i.xlarge
    zones: [us-east-1a, us-east-1b, us-east-1c]
    karpenter: {nodePool: default}
namespaces: [shop]
statefulSets:
  - name: db
    namespace: shop
    replicas: 3
    podManagementPolicy: Parallel
    pod: {image: "postgres:17", cpu: "3", memory: 4Gi}
    volumeClaimTemplates: [{name: data, size: 500Gi}]
velero:
  bucket: velero
"#;

/// Three nodes in one zone (the EBS volume follows its pod within its zone) and one 500 GiB EBS-backed
/// StatefulSet replica whose volume changes 1% (5 GiB) between backups: the simulated kopia repository
/// moves only what changed once it holds the volume.
const EBS_INCREMENTAL: &str = r#"
name: bench-volumes-incremental
description: One 500 GiB EBS-backed replica, 1% changed between backups.
materialize: true
nodePools:
  - name: default
    consolidationPolicy: WhenEmpty
    consolidateAfter: 1h
nodes:
  - count: 3
    instanceType: m6i.xlarge
    zones: [us-east-1a]
    karpenter: {nodePool: default}
namespaces: [shop]
statefulSets:
  - name: db
    namespace: shop
    replicas: 1
    pod: {image: "postgres:17", cpu: "3", memory: 4Gi}
    volumeClaimTemplates: [{name: data, size: 500Gi}]
velero:
  bucket: velero
"#;

/// Three empty nodes: the local-NVMe workloads are made through the API.
const NODES: &str = r#"
name: bench-volumes-local
description: Three nodes for workloads on local NVMe.
materialize: true
nodePools:
  - name: default
    consolidationPolicy: WhenEmpty
    consolidateAfter: 1h
nodes:
  - count: 3
    instanceType: m6i.xlarge
    zones: [us-east-1a, us-east-1b, us-east-1c]
    karpenter: {nodePool: default}
namespaces: [shop]
velero:
  bucket: velero
"#;

fn fast_data() -> Timings {
    Timings {
        backup_mib_per_second: DATA_MIB_PER_SECOND,
        ..Timings::default()
    }
}

fn plans_key() -> ResKey {
    ResKey::new("snapdrain.io", "disruptionplans")
}

fn plan_named<'a>(plans: &'a [std::sync::Arc<Value>], name: &str) -> Option<&'a Value> {
    plans
        .iter()
        .map(|p| p.as_ref())
        .find(|p| p.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
}

fn phase(plan: &Value) -> &str {
    plan.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn failed(plan: &Value) -> Option<String> {
    matches!(phase(plan), "Failed" | "Aborted").then(|| {
        format!(
            "plan {} ended {}: {}",
            plan.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
            phase(plan),
            plan.pointer("/status/message")
                .and_then(Value::as_str)
                .unwrap_or("")
        )
    })
}

fn backups(plan: &Value) -> Vec<&Value> {
    plan.pointer("/status/backups")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn all_verified(plan: &Value) -> bool {
    let b = backups(plan);
    !b.is_empty() && b.iter().all(|b| b["verified"] == true)
}

async fn set_policy(b: &Bench, spec: Value) -> anyhow::Result<()> {
    let policy: snapdrain::api::DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": snapdrain::api::DEFAULT_POLICY}, "spec": spec
    }))?;
    Api::<snapdrain::api::DisruptionPolicy>::all(b.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .context("creating the DisruptionPolicy")?;
    Ok(())
}

async fn create_plan(b: &Bench, name: &str, spec: Value) -> anyhow::Result<Instant> {
    let plan: snapdrain::api::DisruptionPlan = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
        "metadata": {"name": name}, "spec": spec
    }))?;
    let created = Instant::now();
    Api::<snapdrain::api::DisruptionPlan>::all(b.client.clone())
        .create(&PostParams::default(), &plan)
        .await
        .context("creating the plan")?;
    Ok(created)
}

/// Waits for `want` on plan `name`, failing early if the plan fails.
async fn wait_plan(
    b: &Bench,
    name: &str,
    what: &str,
    want: impl Fn(&Value) -> bool,
) -> anyhow::Result<Instant> {
    let error = std::sync::Mutex::new(None);
    let at = wait_store(&b.cluster.store, &plans_key(), what, LIMIT, |ps| {
        let Some(p) = plan_named(ps, name) else {
            return false;
        };
        if let Some(e) = failed(p) {
            *error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            return true;
        }
        want(p)
    })
    .await?;
    match error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => bail!(e),
        None => Ok(at),
    }
}

/// The protected (StatefulSet) pods on the bench node and their claims' bytes.
fn node_data(b: &Bench) -> anyhow::Result<(Vec<String>, u64)> {
    let store = &b.cluster.store;
    let pods = store.snapshot(&ResKey::core("pods")).0;
    let mut names = Vec::new();
    let mut bytes = 0;
    for pod in pods
        .iter()
        .filter(|p| on_node(p, &b.node) && owned_by(p, "StatefulSet"))
    {
        let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str);
        names.push(
            pod.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        );
        for claim in snapdrain_sim::world::objects::pod_claims(pod) {
            let pvc = store
                .get(&ResKey::core("persistentvolumeclaims"), ns, claim)
                .ok_or_else(|| anyhow!("PVC {claim} of a pod on {} is missing", b.node))?;
            bytes += snapdrain_sim::world::velero::scope::pvc_bytes(&pvc);
        }
    }
    if names.is_empty() || bytes == 0 {
        bail!("no protected data on {}", b.node);
    }
    Ok((names, bytes))
}

/// What moving `bytes` must take in world `t`: Velero's fixed overhead and the bytes at its throughput.
fn data_movement(t: &Timings, bytes: u64) -> Duration {
    t.backup_overhead
        + Duration::from_secs_f64(bytes as f64 / (t.backup_mib_per_second * 1024.0 * 1024.0))
}

fn ratio_figure(
    report: &mut Report,
    name: &str,
    took: Duration,
    limit: Duration,
    target: &str,
    note: String,
) {
    let f = report.add(SECTION, name, took.as_secs_f64() / limit.as_secs_f64(), "x");
    f.target = Some(target.into());
    f.note = Some(note);
}

pub async fn run(report: &mut Report) {
    if let Err(e) = ebs_at_the_snapshot(report).await {
        report.skipped(
            SECTION,
            "500 GiB on EBS, released at the CSI snapshot",
            format!("failed: {e:#}"),
        );
    }
    if let Err(e) = local_nvme(report).await {
        report.skipped(SECTION, "500 GiB on local NVMe", format!("failed: {e:#}"));
    }
    if let Err(e) = mixed_node(report).await {
        report.skipped(
            SECTION,
            "a node with EBS and local NVMe",
            format!("failed: {e:#}"),
        );
    }
    if let Err(e) = incremental(report).await {
        report.skipped(
            SECTION,
            "a second backup, 1% changed",
            format!("failed: {e:#}"),
        );
    }
    if let Err(e) = spot_with_500_gib(report).await {
        report.skipped(
            SECTION,
            "spot interruption, 500 GiB on EBS",
            format!("failed: {e:#}"),
        );
    }
}

/// 500 GiB on EBS, a Release plan with `releaseNetworkVolumesAt: Snapshot`.
async fn ebs_at_the_snapshot(report: &mut Report) -> anyhow::Result<()> {
    let t = fast_data();
    let b = start_cluster(EBS_500, "bench-volumes-ebs", t.clone()).await?;
    ebs_snapshot_class(&b.client)
        .await
        .context("the VolumeSnapshotClass")?;
    set_policy(
        &b,
        json!({"planSettings": {"allowReleaseAtSnapshot": true}}),
    )
    .await?;
    let (pods, bytes) = node_data(&b)?;
    let controller = start_controller(&b).await?;
    let created = create_plan(
        &b,
        "at-the-snapshot",
        json!({"nodes": [b.node], "mode": "Release", "backup": {"releaseNetworkVolumesAt": "Snapshot"}}),
    )
    .await?;
    let released_all = |p: &Value| {
        let released: BTreeSet<&str> = p
            .pointer("/status/releasedPods")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect();
        pods.iter().all(|n| released.contains(n.as_str()))
    };
    let result = async {
        let released = wait_plan(&b, "at-the-snapshot", "the pods released", released_all).await?;
        let verified =
            wait_plan(&b, "at-the-snapshot", "the backup verified", all_verified).await?;
        anyhow::Ok((released, verified))
    }
    .await;
    controller.shutdown().await;
    let (released, verified) = result?;
    let plan = b
        .cluster
        .store
        .get(&plans_key(), None, "at-the-snapshot")
        .ok_or_else(|| anyhow!("the plan is gone"))?;
    let early = backups(&plan).iter().all(|r| {
        r.pointer("/volumes")
            .and_then(Value::as_array)
            .is_some_and(|v| v.iter().all(|v| v.get("snapshot").is_some()))
    });
    if !early {
        bail!("the plan recorded no CSI snapshot cut for every volume: {plan}");
    }
    let gib = bytes as f64 / GIB as f64;
    let f = report.add(
        SECTION,
        format!("{gib:.0} GiB on EBS: plan created -> pod released at its CSI snapshot"),
        released.saturating_duration_since(created).as_secs_f64(),
        "s",
    );
    f.target = Some("< 30 s".into());
    f.note = Some(format!(
        "{} pod(s); the data mover still had the bytes to move",
        pods.len()
    ));
    let limit = data_movement(&t, bytes);
    ratio_figure(
        report,
        &format!("{gib:.0} GiB on EBS: plan created -> backup verified / data movement limit"),
        verified.saturating_duration_since(created),
        limit,
        "<= 1.1x",
        format!(
            "verified after {:.1} s; limit {:.1} s (Velero {} ms + {gib:.0} GiB at {} MiB/s); the default policy releases here",
            verified.saturating_duration_since(created).as_secs_f64(),
            limit.as_secs_f64(),
            t.backup_overhead.as_millis(),
            t.backup_mib_per_second
        ),
    );
    Ok(())
}

/// 500 GiB on a node's local NVMe: an Execute plan (default policy) against its physical limit.
async fn local_nvme(report: &mut Report) -> anyhow::Result<()> {
    let t = fast_data();
    let b = start_cluster(NODES, "bench-volumes-local", t.clone()).await?;
    let w = LocalWorkload {
        namespace: "shop",
        name: "scratchdb",
        node: &b.node,
        local_size: "500Gi",
        ebs_size: None,
    };
    local_workload(&b.client, &w, LIMIT)
        .await
        .map_err(|e| anyhow!(e))?;
    let (_, bytes) = node_data(&b)?;
    let rtt = super::limit::round_trip(&b).await?;
    let controller = start_controller(&b).await?;
    let gone = tokio::spawn(PodsGone::subscribe(&b.cluster.store, &b.node).wait());
    let result = async {
        let created = create_plan(&b, "local-nvme", json!({"nodes": [b.node]})).await?;
        wait_plan(&b, "local-nvme", "the plan completed", |p| {
            phase(p) == "Completed"
        })
        .await?;
        anyhow::Ok(created)
    }
    .await;
    controller.shutdown().await;
    let created = result?;
    let (drained, _) = gone.await??;
    let took = drained.saturating_duration_since(created);
    let velero = data_movement(&t, bytes);
    let limit = velero + t.pod_stop + rtt * SEQUENTIAL_ROUND_TRIPS;
    let gib = bytes as f64 / GIB as f64;
    ratio_figure(
        report,
        &format!("{gib:.0} GiB on local NVMe: plan created -> node drained / its physical limit"),
        took,
        limit,
        "<= 1.1x",
        format!(
            "drained after {:.1} s; limit {:.1} s (file-system copy {:.1} s at {} MiB/s + {} ms, pod stop {} ms, {SEQUENTIAL_ROUND_TRIPS} x {:.1} ms round trip)",
            took.as_secs_f64(),
            limit.as_secs_f64(),
            velero.as_secs_f64(),
            t.backup_mib_per_second,
            t.backup_overhead.as_millis(),
            t.pod_stop.as_millis(),
            rtt.as_secs_f64() * 1e3,
        ),
    );
    Ok(())
}

/// One pod with a 100 GiB EBS claim and a 100 GiB local NVMe claim: each backed up its own way.
async fn mixed_node(report: &mut Report) -> anyhow::Result<()> {
    let t = fast_data();
    let b = start_cluster(NODES, "bench-volumes-mixed", t.clone()).await?;
    ebs_snapshot_class(&b.client)
        .await
        .context("the VolumeSnapshotClass")?;
    let w = LocalWorkload {
        namespace: "shop",
        name: "ledger",
        node: &b.node,
        local_size: "100Gi",
        ebs_size: Some("100Gi"),
    };
    local_workload(&b.client, &w, LIMIT)
        .await
        .map_err(|e| anyhow!(e))?;
    let (_, bytes) = node_data(&b)?;
    let controller = start_controller(&b).await?;
    let result = async {
        let created = create_plan(&b, "mixed", json!({"nodes": [b.node]})).await?;
        let done = wait_plan(&b, "mixed", "the plan completed", |p| {
            phase(p) == "Completed"
        })
        .await?;
        anyhow::Ok(done.saturating_duration_since(created))
    }
    .await;
    controller.shutdown().await;
    let took = result?;
    let plan = b
        .cluster
        .store
        .get(&plans_key(), None, "mixed")
        .ok_or_else(|| anyhow!("the plan is gone"))?;
    let methods: BTreeMap<String, String> = backups(&plan)
        .iter()
        .flat_map(|r| r["volumes"].as_array().cloned().unwrap_or_default())
        .map(|v| {
            (
                v["pvc"].as_str().unwrap_or_default().to_owned(),
                format!(
                    "{} {}",
                    v["class"].as_str().unwrap_or("?"),
                    v["method"].as_str().unwrap_or("?")
                ),
            )
        })
        .collect();
    let want = [
        ("data-ledger-0", "Network CsiDataMover"),
        ("scratch-ledger-0", "NodeLocal FileSystem"),
    ];
    for (pvc, method) in want {
        if methods.get(pvc).map(String::as_str) != Some(method) {
            bail!("{pvc} was not backed up as {method}: {methods:?}");
        }
    }
    // The Backup copies the local volume, then snapshots and moves the EBS one (the simulator's order).
    let limit = data_movement(&t, bytes) + t.backup_overhead;
    ratio_figure(
        report,
        &format!(
            "{:.0} GiB, EBS and local NVMe on one node: plan created -> completed / data movement limit",
            bytes as f64 / GIB as f64
        ),
        took,
        limit,
        "each volume its own way",
        format!(
            "{}; completed after {:.1} s, limit {:.1} s",
            methods
                .iter()
                .map(|(p, m)| format!("{p}: {m}"))
                .collect::<Vec<_>>()
                .join(", "),
            took.as_secs_f64(),
            limit.as_secs_f64()
        ),
    );
    Ok(())
}

/// A spot interruption (two minutes' notice) of a node with 500 GiB on EBS, Velero at 2 GiB/s.
async fn spot_with_500_gib(report: &mut Report) -> anyhow::Result<()> {
    let t = Timings::default();
    let mut scenario = snapdrain_sim::scenario::parse(EBS_500, "bench-volumes-spot")?;
    scenario.karpenter = Some(snapdrain_sim::world::karpenter::KarpenterSettings {
        interruption_queue: Some("karpenter-interruptions".into()),
    });
    let b = super::sim::start_scenario(scenario, "bench-volumes-spot", t.clone()).await?;
    let (pods, bytes) = node_data(&b)?;
    let protected = {
        let all: Vec<Value> = b
            .cluster
            .store
            .snapshot(&ResKey::core("pods"))
            .0
            .iter()
            .filter(|p| on_node(p, &b.node))
            .map(|p| p.as_ref().clone())
            .collect();
        safety::protected_pods(&all)
    };
    let controller = start_controller(&b).await?;
    let notice = Duration::from_secs(120);
    let started = Instant::now();
    b.cluster
        .act(&Action::SpotInterruption {
            node: b.node.clone(),
            notice: notice.as_millis() as u64,
        })
        .map_err(|e| anyhow!("the spot interruption: {e}"))?;
    let node = b.node.clone();
    let of_node = |p: &Value| {
        p.pointer("/spec/nodes")
            .and_then(Value::as_array)
            .is_some_and(|n| n.iter().any(|n| n.as_str() == Some(node.as_str())))
    };
    let result = wait_store(
        &b.cluster.store,
        &plans_key(),
        "the node's plan ended",
        LIMIT,
        |ps| {
            ps.iter()
                .any(|p| of_node(p) && matches!(phase(p), "Completed" | "Failed" | "Aborted"))
        },
    )
    .await;
    controller.shutdown().await;
    let ended = result?;
    let plan = b
        .cluster
        .store
        .snapshot(&plans_key())
        .0
        .iter()
        .find(|p| of_node(p))
        .map(|p| p.as_ref().clone())
        .ok_or_else(|| anyhow!("no plan for {}", b.node))?;
    let audit = b.cluster.audit.since(0);
    let pvs: Vec<Value> = b
        .cluster
        .store
        .snapshot(&ResKey::core("persistentvolumes"))
        .0
        .iter()
        .map(|p| p.as_ref().clone())
        .collect();
    let evidence = safety::EbsEvidence {
        claim_volumes: safety::ebs_claim_volumes(&pvs),
        snapshots: safety::Ec2Snapshot::all_of(&b.cluster),
        plan_uids: plan
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .into_iter()
            .collect(),
        csi_cuts: safety::csi_cuts_of(&b.cluster),
        snapshot_release_uids: safety::snapshot_release_uid(&plan).into_iter().collect(),
        pod_starts: safety::pod_starts(&audit),
    };
    let removed = safety::pods_removed(&audit);
    let mut violations: Vec<String> = safety::eviction_violations_with_snapshots(
        &removed,
        &protected,
        &safety::recorded_backups(&plan),
        &evidence,
    )
    .iter()
    .map(ToString::to_string)
    .collect();
    violations.extend(
        snapdrain_testkit::chaos::judge::lost_with_node(&audit, &protected, &evidence)
            .iter()
            .map(|l| {
                format!(
                    "{} lost with node {} (claims {:?})",
                    l.pod, l.node, l.uncovered
                )
            }),
    );
    let left: Vec<&String> = protected
        .keys()
        .filter(|p| !removed.iter().any(|r| &r.pod == *p))
        .collect();
    let saved = protected.len() - left.len();
    let f = report.add(
        SECTION,
        format!(
            "spot interruption (2 min), {:.0} GiB on EBS: protected pods gone after a saved copy",
            bytes as f64 / GIB as f64
        ),
        saved as f64,
        "pods",
    );
    f.target = Some(format!(
        "{} of {}, 0 violations",
        protected.len(),
        protected.len()
    ));
    f.note = Some(format!(
        "plan {} after {:.1} s; {} violation(s){}; Velero would need {:.0} s at {} MiB/s; pods: {}",
        phase(&plan),
        ended.saturating_duration_since(started).as_secs_f64(),
        violations.len(),
        violations
            .iter()
            .map(|v| format!(": {v}"))
            .collect::<String>(),
        data_movement(&t, bytes).as_secs_f64(),
        t.backup_mib_per_second,
        pods.join(", ")
    ));
    if !violations.is_empty() || !left.is_empty() || phase(&plan) != "Completed" {
        bail!(
            "the spot interruption did not end with every volume protected: plan {}, {} violation(s), not removed: {left:?}",
            phase(&plan),
            violations.len()
        );
    }
    Ok(())
}

/// The node the StatefulSet pod `ns/name` runs on.
fn node_of(b: &Bench, ns: &str, name: &str) -> Option<String> {
    b.cluster
        .store
        .get(&ResKey::core("pods"), Some(ns), name)?
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// How long the plan took from BackingUp through Verifying (its own step timings).
fn backup_seconds(plan: &Value) -> f64 {
    ["BackingUp", "Verifying"]
        .iter()
        .filter_map(|p| {
            plan.pointer(&format!("/status/stepTimings/{p}"))
                .and_then(Value::as_f64)
        })
        .sum()
}

/// A 500 GiB EBS volume backed up by an Execute plan (the data mover moves it all), then, with 1% of it
/// changed, by a second plan on the node its pod moved to: the second moves only what changed.
async fn incremental(report: &mut Report) -> anyhow::Result<()> {
    let t = fast_data();
    let b = start_cluster(EBS_INCREMENTAL, "bench-volumes-incremental", t.clone()).await?;
    ebs_snapshot_class(&b.client)
        .await
        .context("the VolumeSnapshotClass")?;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(b.client.clone(), "shop");
    let changed = json!({"metadata": {"annotations": {snapdrain_sim::world::velero::scope::CHANGED_BYTES: "5Gi"}}});
    claims
        .patch(
            "data-db-0",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&changed),
        )
        .await
        .context("annotating the claim with its change rate")?;
    let controller = start_controller(&b).await?;
    let result = async {
        let mut took = Vec::new();
        for name in ["full", "incremental"] {
            // The pod must be running again (on another node) before the next plan backs it up.
            wait_store(
                &b.cluster.store,
                &ResKey::core("pods"),
                "db-0 running",
                LIMIT,
                |ps| {
                    ps.iter().any(|p| {
                        p.pointer("/metadata/name").and_then(Value::as_str) == Some("db-0")
                            && p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
                    })
                },
            )
            .await?;
            let node = node_of(&b, "shop", "db-0").ok_or_else(|| anyhow!("db-0 runs nowhere"))?;
            create_plan(&b, name, json!({"nodes": [node]})).await?;
            wait_plan(&b, name, "the plan completed", |p| phase(p) == "Completed").await?;
            let plan = b
                .cluster
                .store
                .get(&plans_key(), None, name)
                .ok_or_else(|| anyhow!("plan {name} is gone"))?;
            took.push(backup_seconds(&plan));
        }
        anyhow::Ok(took)
    }
    .await;
    controller.shutdown().await;
    let took = result?;
    let (first, second) = (took[0], took[1]);
    let f = report.add(
        SECTION,
        "500 GiB on EBS, 1% changed: second backup / first backup",
        second / first,
        "x",
    );
    f.target = Some("< 0.1x".into());
    f.note = Some(format!(
        "first {first:.1} s (all 500 GiB through the data mover), second {second:.1} s (5 GiB changed; kopia moves only that); BackingUp + Verifying of each plan"
    ));
    Ok(())
}
