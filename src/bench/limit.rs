//! One plan against its physical limit (issue "Scale and speed"): with the world at its default
//! timings, a node holding one 20 GiB StatefulSet replica cannot be drained sooner than Velero moves
//! that node's own bytes (its fixed overhead plus bytes / throughput), the slowest pod stops, and the
//! API round trips between the steps. The ratio of the plan's time to that sum is what snapdrain adds.

use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::Value;

use super::report::Report;
use super::scenarios;
use super::sim::{Bench, PodsGone, on_node, owned_by, run_plan, start_cluster, start_controller};
use super::stats::Summary;
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::world::Timings;
use snapdrain_sim::world::velero::scope::pvc_bytes;

const SECTION: &str = "controller";
/// The steps a plan cannot do without waiting on the API server in turn: create the plan, cordon,
/// create the Backup, read it Completed, read the bucket, evict.
const SEQUENTIAL_ROUND_TRIPS: u32 = 6;

/// What the node's StatefulSet pods hold: their PVCs' sizes (capacity, else the request), and the
/// longest any of the node's pods may take to stop in this world (`podStop`, never more than grace).
fn node_load(b: &Bench, t: &Timings) -> anyhow::Result<(u64, usize, Duration)> {
    let store = &b.cluster.store;
    let pods = store.snapshot(&ResKey::core("pods")).0;
    let on: Vec<&Value> = pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| on_node(p, &b.node) && !owned_by(p, "DaemonSet"))
        .collect();
    let mut bytes = 0;
    let mut stateful = 0;
    for pod in on.iter().filter(|p| owned_by(p, "StatefulSet")) {
        stateful += 1;
        let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str);
        let claims = pod.pointer("/spec/volumes").and_then(Value::as_array);
        for claim in claims.into_iter().flatten().filter_map(|v| {
            v.pointer("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
        }) {
            let pvc = store
                .get(&ResKey::core("persistentvolumeclaims"), ns, claim)
                .ok_or_else(|| anyhow!("PVC {claim} of a pod on {} is missing", b.node))?;
            // The size the simulated Velero moves for this PVC, so the limit is the world's own.
            let size = pvc_bytes(&pvc);
            if size == 0 {
                bail!("PVC {claim} has no size");
            }
            bytes += size;
        }
    }
    let longest_stop = on
        .iter()
        .map(|p| {
            let grace = p
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_u64)
                .unwrap_or(30);
            t.pod_stop.min(Duration::from_secs(grace))
        })
        .max()
        .unwrap_or_default();
    Ok((bytes, stateful, longest_stop))
}

/// Median of a few GETs of the node: one API round trip as the controller sees it.
pub(super) async fn round_trip(b: &Bench) -> anyhow::Result<Duration> {
    let nodes: Api<Node> = Api::all(b.client.clone());
    let mut samples = Vec::new();
    for _ in 0..9 {
        let t0 = Instant::now();
        nodes.get(&b.node).await.context("reading the node")?;
        samples.push(t0.elapsed());
    }
    samples.sort();
    Ok(samples[samples.len() / 2])
}

pub async fn physical_limit(runs: usize, report: &mut Report) -> anyhow::Result<()> {
    let t = Timings::default();
    let (mut ratios, mut took) = (Vec::new(), Vec::new());
    let mut note = String::new();
    for run in 0..runs {
        let b = start_cluster(scenarios::LIMIT, "bench-limit", t.clone()).await?;
        let (bytes, stateful, longest_stop) = node_load(&b, &t)?;
        let rtt = round_trip(&b).await?;
        let velero = t.backup_overhead
            + Duration::from_secs_f64(bytes as f64 / (t.backup_mib_per_second * 1024.0 * 1024.0));
        let limit = velero + longest_stop + rtt * SEQUENTIAL_ROUND_TRIPS;
        let controller = start_controller(&b).await?;
        let gone = tokio::spawn(PodsGone::subscribe(&b.cluster.store, &b.node).wait());
        let result = run_plan(&b, &format!("limit-{run}")).await;
        controller.shutdown().await;
        let (created, _) = result?;
        let (drained, _) = gone.await??;
        let plan = drained.saturating_duration_since(created);
        took.push(plan);
        ratios.push(plan.as_secs_f64() / limit.as_secs_f64());
        note = format!(
            "node with {stateful} StatefulSet pod(s), {:.1} GiB: Velero {:.2} s ({} MiB/s + {} ms), slowest pod stop {} ms, {SEQUENTIAL_ROUND_TRIPS} x {:.1} ms round trip; limit {:.2} s",
            bytes as f64 / (1u64 << 30) as f64,
            velero.as_secs_f64(),
            t.backup_mib_per_second,
            t.backup_overhead.as_millis(),
            longest_stop.as_millis(),
            rtt.as_secs_f64() * 1000.0,
            limit.as_secs_f64(),
        );
    }
    if let Some(s) = Summary::of(&took) {
        report.add_summary_ms(
            SECTION,
            "one-node plan: created -> node drained (default world timings)",
            &s,
            None,
            Some(&note),
        );
    }
    if let Some(worst) = ratios.iter().copied().reduce(f64::max) {
        let runs: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let f = report.add(
            SECTION,
            "one-node plan / its physical limit (worst run)",
            worst,
            "x",
        );
        f.target = Some("<= 1.2x".into());
        f.note = Some(format!("runs: {}", runs.join(", ")));
    }
    Ok(())
}
