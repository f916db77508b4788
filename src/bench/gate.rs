//! The eviction gate's cost to a drainer: dry-run evictions through the simulated API server, which
//! calls snapdrain's webhook over TLS for each (as kube-apiserver's validating dispatcher does), timed
//! from the client. A held (protected) pod and an allowed one are measured apart: the first also builds
//! the 429 message, the second is what every unprotected pod of a drain pays.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::report::Report;
use super::scenarios;
use super::stats::Summary;
use snapdrain::controller::run::RunOptions;
use snapdrain::planning::inventory::ProtectionRule;
use snapdrain::webhook::WebhookConfig;
use snapdrain_sim::apiserver::admission::ADDRESS_ANNOTATION;
use snapdrain_sim::world::Timings;
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};

const SECTION: &str = "gate";
const NS: &str = "snapdrain";
/// Dry-run evictions per run and per kind of pod.
const REQUESTS: usize = 50;

pub(super) async fn create<K>(
    api: &Api<K>,
    obj: serde_json::Value,
    what: &str,
) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj).with_context(|| format!("{what} JSON"))?;
    api.create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating {what}"))?;
    Ok(())
}

/// Evictions in flight at once in the storm: Karpenter and Cluster Autoscaler evict a node's pods in
/// parallel, and several nodes at a time.
const STORM_CONCURRENCY: usize = 32;
/// Evictions in the storm, per run.
const STORM: usize = 400;

/// Times one dry-run eviction of `ns/name`, which must get `want` (429 held, 201 allowed).
pub(super) async fn evict_once(
    client: &Client,
    ns: &str,
    name: &str,
    want: u16,
) -> anyhow::Result<Duration> {
    let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": ns}, "deleteOptions": {"dryRun": ["All"]}});
    let req = http::Request::post(format!(
        "/api/v1/namespaces/{ns}/pods/{name}/eviction?dryRun=All"
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body)?)?;
    let started = Instant::now();
    let code = match client.request::<kube::core::Status>(req).await {
        Ok(_) => 201,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => bail!("dry-run eviction of {ns}/{name}: {e}"),
    };
    let took = started.elapsed();
    if code != want {
        bail!("dry-run eviction of {ns}/{name} answered {code}, expected {want}");
    }
    Ok(took)
}

/// Times `REQUESTS` sequential dry-run evictions of `ns/name`.
async fn evictions(
    client: &Client,
    ns: &str,
    name: &str,
    want: u16,
) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        out.push(evict_once(client, ns, name, want).await?);
    }
    Ok(out)
}

/// `STORM` dry-run evictions, `STORM_CONCURRENCY` at a time, alternating the held and the allowed pod.
async fn storm(client: &Client, held: &str, allowed: &str) -> anyhow::Result<Vec<Duration>> {
    use futures::StreamExt;
    futures::stream::iter(0..STORM)
        .map(|i| async move {
            if i % 2 == 0 {
                evict_once(client, "shop", held, 429).await
            } else {
                evict_once(client, "shop", allowed, 201).await
            }
        })
        .buffer_unordered(STORM_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Finished plans stored for the second pass: the gate must not slow down as plans pile up (it keeps
/// them in a store, and a refusal for a node without a plan must not list them all).
const STORED_PLANS: usize = 1_000;

pub async fn latency(runs: usize, report: &mut Report) -> anyhow::Result<()> {
    let (mut held, mut allowed, mut stormed) = (Vec::new(), Vec::new(), Vec::new());
    let mut held_stored = Vec::new();
    for run in 0..runs * 2 {
        // Even runs on a fresh cluster, odd ones with STORED_PLANS finished plans stored.
        let stored = if run % 2 == 1 { STORED_PLANS } else { 0 };
        let scenario = snapdrain_sim::scenario::parse(scenarios::OVERHEAD, "bench-gate")?;
        let cluster = SimCluster::start(SimConfig {
            scenario: Some(ScenarioSource::Inline {
                scenario: Box::new(scenario),
                label: "bench-gate".into(),
            }),
            timings: Some(Timings::instant()),
            ..Default::default()
        })
        .await?;
        let mut cfg = cluster.kube_config();
        // 429s are the measurement: the client must not retry them itself.
        cfg.default_retry = false;
        let client = Client::try_from(cfg)?;
        snapdrain_testkit::harness::install_plan_crd(&client).await?;
        create(
            &Api::<Namespace>::all(client.clone()),
            json!({"metadata": {"name": NS}}),
            "namespace",
        )
        .await?;
        create(
            &Api::<ValidatingWebhookConfiguration>::all(client.clone()),
            json!({"metadata": {"name": "snapdrain"}, "webhooks": [{
                "name": "gate.snapdrain.io",
                "clientConfig": {"service": {"namespace": NS, "name": "snapdrain-webhook", "path": "/validate"}},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/eviction"]}],
                "failurePolicy": "Fail", "sideEffects": "NoneOnDryRun", "admissionReviewVersions": ["v1"], "timeoutSeconds": 5}]}),
            "the ValidatingWebhookConfiguration",
        )
        .await?;
        if stored > 0 {
            let nodes: Vec<String> = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
                .list(&Default::default())
                .await?
                .items
                .iter()
                .map(ResourceExt::name_any)
                .collect();
            super::sim::seed_finished_plans(&cluster.store, &nodes, stored)?;
        }
        let settings = snapdrain_testkit::controller_settings(&cluster, "snapdrain-bench")
            .ok_or_else(|| anyhow!("the simulated world runs no EC2 endpoint"))?;
        let opts = RunOptions {
            lease_namespace: None,
            webhook: Some(WebhookConfig {
                addr: SocketAddr::from(([127, 0, 0, 1], 0)),
                ..WebhookConfig::default()
            }),
            ..RunOptions::default()
        };
        let controller =
            snapdrain::controller::start(cluster.kube_config(), settings, opts).await?;
        let addr = controller
            .webhook_addr
            .ok_or_else(|| anyhow!("the gate does not listen"))?;
        create(
            &Api::<Service>::namespaced(client.clone(), NS),
            json!({"metadata": {"name": "snapdrain-webhook", "annotations": {ADDRESS_ANNOTATION: addr.to_string()}},
                   "spec": {"ports": [{"port": 443}]}}),
            "the webhook Service",
        )
        .await?;
        let pods = Api::<Pod>::namespaced(client.clone(), "shop")
            .list(&Default::default())
            .await?
            .items;
        let rule = ProtectionRule::default();
        let protected = pods
            .iter()
            .find(|p| rule.protects(p))
            .ok_or_else(|| anyhow!("no protected pod in the scenario"))?
            .name_any();
        let other = pods
            .iter()
            .find(|p| !rule.protects(p))
            .ok_or_else(|| anyhow!("no unprotected pod in the scenario"))?
            .name_any();
        let result = async {
            if stored > 0 {
                held_stored.extend(evictions(&client, "shop", &protected, 429).await?);
                return anyhow::Ok(());
            }
            held.extend(evictions(&client, "shop", &protected, 429).await?);
            allowed.extend(evictions(&client, "shop", &other, 201).await?);
            stormed.extend(storm(&client, &protected, &other).await?);
            anyhow::Ok(())
        }
        .await;
        controller.shutdown().await;
        result?;
    }
    let note = format!(
        "{REQUESTS} sequential dry-run evictions per run through the simulated API server, webhook over TLS"
    );
    for (name, samples) in [
        ("dry-run eviction held by the gate (429)", &held),
        ("dry-run eviction allowed by the gate", &allowed),
    ] {
        if let Some(s) = Summary::of(samples) {
            report.add_summary_ms(SECTION, name, &s, None, Some(&note));
        }
    }
    if let Some(s) = Summary::of(&held_stored) {
        report.add_summary_ms(
            SECTION,
            "dry-run eviction held by the gate (429), 1,000 finished plans stored",
            &s,
            None,
            Some(&format!(
                "{note}; the first answer for the node starts its plan"
            )),
        );
    }
    if let Some(s) = Summary::of(&stormed) {
        report.add_summary_ms(
            SECTION,
            "dry-run eviction in a storm (held and allowed)",
            &s,
            None,
            Some(&format!(
                "{STORM} evictions per run, {STORM_CONCURRENCY} in flight, as Karpenter and Cluster Autoscaler send them"
            )),
        );
    }
    Ok(())
}
