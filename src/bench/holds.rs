//! How soon a new protected pod is held: StatefulSet pods are added by a scale-up and a watch (what
//! Karpenter sees) times each from its first appearance to the first version carrying snapdrain's
//! `karpenter.sh/do-not-disrupt` hold. DESIGN.md: holds are placed within a second.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::report::Report;
use super::scenarios;
use super::stats::Summary;
use snapdrain::controller::run::RunOptions;
use snapdrain_sim::world::Timings;
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};

const SECTION: &str = "holds";
/// Pods added per run.
const NEW_PODS: i32 = 10;
const WAIT: Duration = Duration::from_secs(60);

fn held(p: &Pod) -> bool {
    p.annotations()
        .get("karpenter.sh/do-not-disrupt")
        .is_some_and(|v| v == "true")
        && p.annotations().contains_key("snapdrain.io/held")
}

/// Watches the pods of StatefulSet `db`: once its `existing` pods are held, runs `after` (the
/// scale-up), then waits for `want` more to be held. Returns, per new pod, the time from its first
/// appearance to its first held version.
async fn watch_until_held(
    pods: Api<Pod>,
    existing: usize,
    want: usize,
    mut after: impl FnMut() -> Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
) -> anyhow::Result<Vec<Duration>> {
    let mut first_seen: BTreeMap<String, Instant> = BTreeMap::new();
    let mut latency: BTreeMap<String, Duration> = BTreeMap::new();
    let mut initial: Option<usize> = None;
    let mut scaling = None;
    let stream = watcher(pods, watcher::Config::default().labels("app=db")).applied_objects();
    let mut stream = std::pin::pin!(stream);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .map_err(|_| anyhow!("pods were not all held within {WAIT:?}"))?;
        let Some(pod) = next else {
            bail!("the pod watch ended");
        };
        let pod = pod.context("pod watch")?;
        let name = pod.name_any();
        let now = Instant::now();
        first_seen.entry(name.clone()).or_insert(now);
        if held(&pod) && !latency.contains_key(&name) {
            latency.insert(name.clone(), now - first_seen[&name]);
        }
        // The pods of the scenario first: once all are held, the scale-up starts.
        if initial.is_none() && latency.len() >= existing && latency.len() == first_seen.len() {
            initial = Some(first_seen.len());
            scaling = after();
        }
        if let Some(n) = initial
            && latency.len() >= n + want
        {
            if let Some(task) = scaling {
                task.await.context("scale-up task")??;
            }
            break;
        }
    }
    let n = initial.unwrap_or_default();
    // The first n held pods are the scenario's own (held at start-up): only the new ones count.
    let mut by_time: Vec<(Instant, Duration)> = latency
        .iter()
        .map(|(name, d)| (first_seen[name], *d))
        .collect();
    by_time.sort_by_key(|(t, _)| *t);
    Ok(by_time.into_iter().skip(n).map(|(_, d)| d).collect())
}

pub async fn latency(runs: usize, report: &mut Report) -> anyhow::Result<()> {
    let mut samples = Vec::new();
    for _ in 0..runs {
        let scenario = snapdrain_sim::scenario::parse(scenarios::OVERHEAD, "bench-holds")?;
        let cluster = SimCluster::start(SimConfig {
            scenario: Some(ScenarioSource::Inline {
                scenario: Box::new(scenario),
                label: "bench-holds".into(),
            }),
            timings: Some(Timings::instant()),
            ..Default::default()
        })
        .await?;
        let client = Client::try_from(cluster.kube_config())?;
        snapdrain_testkit::harness::install_plan_crd(&client).await?;
        let settings = snapdrain_testkit::controller_settings(&cluster, "snapdrain-bench")
            .ok_or_else(|| anyhow!("the simulated world runs no EC2 endpoint"))?;
        let controller = snapdrain::controller::start(
            cluster.kube_config(),
            settings,
            RunOptions {
                lease_namespace: None,
                ..RunOptions::default()
            },
        )
        .await?;
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "shop");
        let current = sets
            .get("db")
            .await?
            .spec
            .and_then(|s| s.replicas)
            .unwrap_or(1);
        let scale = move || {
            let sets = sets.clone();
            Some(tokio::spawn(async move {
                sets.patch(
                    "db",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": current + NEW_PODS}})),
                )
                .await
                .context("scale up StatefulSet db")?;
                anyhow::Ok(())
            }))
        };
        let result = watch_until_held(
            Api::<Pod>::namespaced(client.clone(), "shop"),
            usize::try_from(current).unwrap_or_default(),
            NEW_PODS as usize,
            scale,
        )
        .await;
        controller.shutdown().await;
        samples.extend(result?);
    }
    if let Some(s) = Summary::of(&samples) {
        report.add_summary_ms(
            SECTION,
            "new protected pod appears -> held",
            &s,
            Some(("p99", "< 1000 ms")),
            Some(&format!(
                "{NEW_PODS} StatefulSet pods added per run, timed by a pod watch (what Karpenter sees)"
            )),
        );
    }
    Ok(())
}
