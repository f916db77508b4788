//! Bringing the stage up: the simulated cluster with a scenario, the DisruptionPlan CRD, the controller
//! (in this process, no leader election) pointed at the simulator's API server and EC2 endpoint.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use snapdrain::controller::run::RunOptions;
use snapdrain::controller::{ControllerHandle, Settings, start};
use snapdrain_sim::world::Timings;
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};
use snapdrain_testkit::harness::install_plan_crd;

/// Starts the cluster, installs the CRD and waits until every StatefulSet is Ready.
pub async fn start_cluster(
    scenario: &str,
    timings: Option<Timings>,
    ready_within: Duration,
) -> anyhow::Result<(SimCluster, Client)> {
    start_cluster_from(
        ScenarioSource::Named(scenario.to_string()),
        timings,
        ready_within,
    )
    .await
}

/// [`start_cluster`] with a scenario given as a source (a changed built-in one, for instance).
pub async fn start_cluster_from(
    source: ScenarioSource,
    timings: Option<Timings>,
    ready_within: Duration,
) -> anyhow::Result<(SimCluster, Client)> {
    let scenario = match &source {
        ScenarioSource::Named(n) => n.clone(),
        ScenarioSource::Inline { label, .. } => label.clone(),
    };
    let cluster = SimCluster::start(SimConfig {
        scenario: Some(source),
        timings,
        ..SimConfig::default()
    })
    .await
    .with_context(|| format!("cannot start the simulated cluster with scenario {scenario}"))?;
    let client = client_for(&cluster)?;
    install_plan_crd(&client)
        .await
        .context("cannot install the DisruptionPlan CRD into the simulated cluster")?;
    wait_statefulsets_ready(&client, ready_within)
        .await
        .with_context(|| format!("scenario {scenario} did not settle"))?;
    Ok((cluster, client))
}

pub fn client_for(cluster: &SimCluster) -> anyhow::Result<Client> {
    Client::try_from(cluster.kube_config())
        .context("cannot build a Kubernetes client for the simulated cluster")
}

/// Controller settings for the simulator: its EC2 endpoint and region, static credentials, and the
/// cluster settings a Bottlerocket replacement needs to join.
pub fn controller_settings(cluster: &SimCluster) -> anyhow::Result<Settings> {
    let mut settings = snapdrain_testkit::controller_settings(cluster, "snapdrain-demo")
        .ok_or_else(|| anyhow!("the simulated cluster runs no EC2 endpoint (it has no world)"))?;
    // A failed backup retried at a person's pace, so the story can be followed.
    settings.backup_retry_cap = Duration::from_secs(2);
    Ok(settings)
}

/// The DisruptionPolicy the demo's platform team writes: the default rules, plus the Bottlerocket
/// settings the demo's replacement carries (its node label and taint, and the inotify sysctls), which
/// the default policy refuses.
pub fn demo_policy() -> serde_json::Value {
    serde_json::json!({"replacement": {"allowedSettings": [
        format!("kubernetes.node-labels.{}", super::plan::REPLACEMENT_LABEL.0),
        format!("kubernetes.node-taints.{}", super::plan::REPLACEMENT_TAINT.0),
        "kernel.sysctl.fs.inotify",
    ]}})
}

/// The controller in this process, a single replica (no Lease), under [`demo_policy`] (written first,
/// so the controller reads it before it judges the demo's plan).
pub async fn start_controller(cluster: &SimCluster) -> anyhow::Result<ControllerHandle> {
    let client = client_for(cluster)?;
    let policy: snapdrain::api::DisruptionPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": snapdrain::api::DEFAULT_POLICY}, "spec": demo_policy()
    }))
    .context("the demo's DisruptionPolicy does not match the CRD types (a bug in the demo)")?;
    match Api::<snapdrain::api::DisruptionPolicy>::all(client)
        .create(&kube::api::PostParams::default(), &policy)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).context("cannot write the demo's DisruptionPolicy"),
    }
    let settings = controller_settings(cluster)?;
    let opts = RunOptions {
        lease_namespace: None,
        ..RunOptions::default()
    };
    start(cluster.kube_config(), settings, opts)
        .await
        .context("cannot start the snapdrain controller")
}

fn is_ready(s: &StatefulSet) -> bool {
    let want = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = s
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    ready >= want
}

/// Waits (by watch) until every StatefulSet has all its replicas Ready.
async fn wait_statefulsets_ready(client: &Client, within: Duration) -> anyhow::Result<()> {
    let api: Api<StatefulSet> = Api::all(client.clone());
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let deadline = tokio::time::Instant::now() + within;
    let mut seen: BTreeMap<String, bool> = BTreeMap::new();
    let mut listed = false;
    loop {
        let event = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(ev))) => ev,
            Ok(Some(Err(e))) => return Err(e).context("watching StatefulSets failed"),
            Ok(None) => bail!("the StatefulSet watch ended unexpectedly"),
            Err(_) => {
                let waiting: Vec<_> = seen.iter().filter(|(_, r)| !**r).map(|(n, _)| n).collect();
                bail!(
                    "StatefulSets not Ready within {within:?}: {waiting:?}; the simulator's world may be stuck (run with RUST_LOG=info to see it)"
                );
            }
        };
        match event {
            watcher::Event::Init => seen.clear(),
            watcher::Event::InitApply(s) | watcher::Event::Apply(s) => {
                let key = format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any());
                seen.insert(key, is_ready(&s));
            }
            watcher::Event::Delete(s) => {
                seen.remove(&format!(
                    "{}/{}",
                    s.namespace().unwrap_or_default(),
                    s.name_any()
                ));
            }
            watcher::Event::InitDone => listed = true,
        }
        if listed && seen.is_empty() {
            bail!(
                "the scenario has no StatefulSets, so there is nothing to back up; use a scenario with StatefulSet volumes (e.g. quickstart)"
            );
        }
        if listed && seen.values().all(|r| *r) {
            return Ok(());
        }
    }
}
