//! The eviction gate's cost to a drainer: dry-run evictions through the simulated API server, which
//! calls snapdrain's webhook over TLS for each (as kube-apiserver's validating dispatcher does), timed
//! from the client. A held (protected) pod and an allowed one are measured apart: the first also builds
//! the 429 message, the second is what every unprotected pod of a drain pays.

use std::collections::BTreeMap;
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
    let (code, message) = match client.request::<kube::core::Status>(req).await {
        Ok(_) => (201, String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => bail!("dry-run eviction of {ns}/{name}: {e}"),
    };
    let took = started.elapsed();
    if code != want {
        bail!("dry-run eviction of {ns}/{name} answered {code} ({message}), expected {want}");
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

/// The open-loop run: evictions sent at a fixed rate whatever the answers' pace (as many drainers at
/// once would), for this long.
const RATE_PER_SECOND: u32 = 1_000;
const RATE_SECONDS: u32 = 10;
/// One eviction in this many asks for the protected pod; the rest are the unprotected pods a drain
/// mostly moves.
const HELD_EVERY: u32 = 10;

/// One dry-run eviction sent at `due`; its latency counts from `due`, so a send held up by a backed-up
/// client counts against the answer (no coordinated omission). The answer's HTTP code, or the error.
async fn evict_at(client: Client, name: String, due: Instant) -> Result<(u16, Duration), String> {
    let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": "shop"}, "deleteOptions": {"dryRun": ["All"]}});
    let req = http::Request::post(format!(
        "/api/v1/namespaces/shop/pods/{name}/eviction?dryRun=All"
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body).map_err(|e| e.to_string())?)
    .map_err(|e| e.to_string())?;
    let code = match client.request::<kube::core::Status>(req).await {
        Ok(_) => 201,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => return Err(e.to_string()),
    };
    Ok((code, due.elapsed()))
}

/// The gate at [`RATE_PER_SECOND`] evictions per second, with 1,000 finished plans stored: the webhook
/// call as the simulated API server's dispatcher times it (the figure the target is about: what the
/// gate adds to an eviction), and each eviction end to end from its scheduled send.
pub async fn rate(report: &mut Report) -> anyhow::Result<()> {
    let g = gated(STORED_PLANS).await?;
    let result = async {
        // The gate answers 429 until its caches are in (`decision::loading_message`): wait for that, then warm
        // the connections; the figure is the steady rate, not the start.
        let ready = Instant::now() + Duration::from_secs(60);
        while let Err(e) = evict_once(&g.client, "shop", &g.other, 201).await {
            if Instant::now() >= ready {
                return Err(e.context("the gate never allowed an unprotected pod"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        evictions(&g.client, "shop", &g.other, 201).await?;
        let calls_before = g
            .cluster
            .api
            .state
            .admission
            .webhook_durations(WEBHOOK)
            .len();
        let total = RATE_PER_SECOND * RATE_SECONDS;
        let interval = Duration::from_secs(1) / RATE_PER_SECOND;
        let started = Instant::now();
        let mut sent = tokio::task::JoinSet::new();
        for i in 0..total {
            let due = started + interval * i;
            tokio::time::sleep_until(due.into()).await;
            let name = if i % HELD_EVERY == 0 {
                &g.protected
            } else {
                &g.other
            };
            sent.spawn(evict_at(g.client.clone(), name.clone(), due));
        }
        let sending = started.elapsed();
        let (mut latencies, mut codes, mut errors) = (Vec::new(), BTreeMap::new(), Vec::new());
        while let Some(done) = sent.join_next().await {
            match done? {
                Ok((code, took)) => {
                    *codes.entry(code).or_insert(0usize) += 1;
                    latencies.push(took);
                }
                Err(e) => errors.push(e),
            }
        }
        let answered = started.elapsed();
        let calls = g.cluster.api.state.admission.webhook_durations(WEBHOOK);
        let calls = calls.get(calls_before..).unwrap_or_default();
        anyhow::Ok((latencies, codes, errors, calls.to_vec(), sending, answered))
    }
    .await;
    g.controller.shutdown().await;
    let (latencies, codes, errors, calls, sending, answered) = result?;
    let total = RATE_PER_SECOND * RATE_SECONDS;
    let codes: Vec<String> = codes.iter().map(|(c, n)| format!("{n} x {c}")).collect();
    let mut note = format!(
        "{total} dry-run evictions offered at {RATE_PER_SECOND}/s ({}/s sent, {:.0}/s answered), 1 in {HELD_EVERY} for a protected pod, 1,000 finished plans stored; answers {}",
        (total as f64 / sending.as_secs_f64()).round(),
        latencies.len() as f64 / answered.as_secs_f64(),
        codes.join(", "),
    );
    if let Some(first) = errors.first() {
        note.push_str(&format!("; {} failed, first: {first}", errors.len()));
    }
    if let Some(s) = Summary::of(&calls) {
        report.add_summary_ms(
            SECTION,
            "gate webhook call at 1,000 evictions/s, as the API server times it",
            &s,
            Some(("p99", "< 5 ms")),
            Some(&note),
        );
    }
    if let Some(s) = Summary::of(&latencies) {
        report.add_summary_ms(
            SECTION,
            "dry-run eviction end to end at 1,000/s offered, from its scheduled send",
            &s,
            None,
            Some("client -> simulated API server -> gate over TLS -> answer, on the same machine"),
        );
    }
    Ok(())
}

/// Finished plans stored for the second pass: the gate must not slow down as plans pile up (it keeps
/// them in a store, and a refusal for a node without a plan must not list them all).
const STORED_PLANS: usize = 1_000;

/// A simulated cluster with snapdrain's gate registered (`failurePolicy: Fail`) and the controller
/// serving it, plus one protected and one unprotected pod of the scenario to evict.
struct Gated {
    cluster: SimCluster,
    client: Client,
    controller: snapdrain::controller::ControllerHandle,
    protected: String,
    other: String,
}

/// The webhook's name in the configuration, as the simulated dispatcher records its calls.
const WEBHOOK: &str = "gate.snapdrain.io";

/// The gate's namespace and its registration for evictions, `failurePolicy: Fail`, as the chart
/// installs it (the caBundle is the controller's to write; its Service is the caller's).
pub(super) async fn register_gate(client: &Client) -> anyhow::Result<()> {
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({"metadata": {"name": NS}}),
        "namespace",
    )
    .await?;
    create(
        &Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        json!({"metadata": {"name": "snapdrain"}, "webhooks": [{
            "name": WEBHOOK,
            "clientConfig": {"service": {"namespace": NS, "name": "snapdrain-webhook", "path": "/validate"}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/eviction"]}],
            "failurePolicy": "Fail", "sideEffects": "NoneOnDryRun", "admissionReviewVersions": ["v1"], "timeoutSeconds": 5}]}),
        "the ValidatingWebhookConfiguration",
    )
    .await
}

async fn gated(stored: usize) -> anyhow::Result<Gated> {
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
    register_gate(&client).await?;
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
    let controller = snapdrain::controller::start(cluster.kube_config(), settings, opts).await?;
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
    Ok(Gated {
        cluster,
        client,
        controller,
        protected,
        other,
    })
}

pub async fn latency(runs: usize, report: &mut Report) -> anyhow::Result<()> {
    let (mut held, mut allowed, mut stormed) = (Vec::new(), Vec::new(), Vec::new());
    let mut held_stored = Vec::new();
    for run in 0..runs * 2 {
        // Even runs on a fresh cluster, odd ones with STORED_PLANS finished plans stored.
        let stored = if run % 2 == 1 { STORED_PLANS } else { 0 };
        let g = gated(stored).await?;
        let (client, protected, other) = (&g.client, &g.protected, &g.other);
        let result = async {
            if stored > 0 {
                held_stored.extend(evictions(client, "shop", protected, 429).await?);
                return anyhow::Ok(());
            }
            held.extend(evictions(client, "shop", protected, 429).await?);
            allowed.extend(evictions(client, "shop", other, 201).await?);
            stormed.extend(storm(client, protected, other).await?);
            anyhow::Ok(())
        }
        .await;
        g.controller.shutdown().await;
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
