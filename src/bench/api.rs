//! The simulated API server at DESIGN scale (`scale-5k`: 5,000 nodes, 150,000 pods): how long the
//! scenario takes to load, full and paged pod lists over HTTP with real clients, watch fan-out, and the
//! memory all of that takes.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::report::Report;
use super::stats::{Summary, rss_mib};
use snapdrain_sim::apiserver::audit::Audit;
use snapdrain_sim::apiserver::faults::Faults;
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::apiserver::store::{Store, WriteOptions, meta_str};
use snapdrain_sim::apiserver::{ApiServer, Settings};
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};

const SECTION: &str = "api";
/// How long the watchers get to see every update before the measurement is called failed.
const FANOUT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Clone, Debug)]
pub struct ApiOptions {
    pub runs: usize,
    /// Pod status updates written through the store for the watch fan-out.
    pub updates: usize,
    pub watchers: usize,
}

/// Runs the API measurements and returns the loaded store, so planning can use its inventory.
///
/// Lists and watches run against a bare API server over the scale-5k store, without the world: the
/// world at this size is busy on its own (scale-5k's NodePool consolidates its underutilized nodes
/// from the start, each a drain), and the figures would measure that rather than the API server. The
/// full `SimCluster::start`, world included, is timed last on its own, then a NodeClaim deletion in it.
pub async fn run(opts: &ApiOptions, report: &mut Report) -> anyhow::Result<Store> {
    let started = Instant::now();
    let store = load_scale_store()?;
    let load = started.elapsed();
    let pod_count = store.snapshot(&ResKey::core("pods")).0.len();
    let f = report.add(
        SECTION,
        "load scale-5k into the store (scenario::load)",
        load.as_secs_f64(),
        "s",
    );
    f.target = Some("< 30 s (release)".into());
    f.note = Some(format!("{pod_count} pods, materialized; no world"));
    add_rss(report, "RSS after load");

    let server = ApiServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        store.clone(),
        Arc::new(Audit::default()),
        Arc::new(Faults::default()),
        Settings::default(),
    )
    .await
    .context("starting the API server")?;
    let client = Client::try_from(server.admin_config().map_err(anyhow::Error::msg)?)?;
    let http = snapdrain_testkit::trusting(&server.pki.ca_pem)
        .default_headers(snapdrain_testkit::admin_headers())
        .build()?;
    full_lists(&server.url(), &client, &http, opts.runs, pod_count, report).await?;
    add_rss(report, "RSS after full lists");
    paged_lists(&client, opts.runs, pod_count, report).await?;
    watch_fanout(&store, &client, opts, report).await?;
    add_rss(report, "RSS after watch fan-out");
    drop(server);
    full_cluster_start(report).await?;
    Ok(store)
}

/// `scale-5k` in a bare store (no API server, no world).
pub fn load_scale_store() -> anyhow::Result<Store> {
    let store = Store::new();
    snapdrain_sim::scenario::crds::install(&store).map_err(anyhow::Error::msg)?;
    let scenario = snapdrain_sim::scenario::builtin::scale_5k();
    snapdrain_sim::scenario::load(
        &store,
        &scenario,
        "built-in scale-5k",
        snapdrain_sim::scenario::S3_URL_FALLBACK,
    )
    .context("loading scale-5k")?;
    Ok(store)
}

/// What `snapdrain sim serve --scenario scale-5k` waits for: store, scenario, endpoints, world started.
async fn full_cluster_start(report: &mut Report) -> anyhow::Result<()> {
    let started = Instant::now();
    let cluster = SimCluster::start(SimConfig {
        scenario: Some(ScenarioSource::Named("scale-5k".into())),
        ..Default::default()
    })
    .await
    .context("starting the scale-5k scenario")?;
    let f = report.add(
        SECTION,
        "load scale-5k, full SimCluster::start",
        started.elapsed().as_secs_f64(),
        "s",
    );
    f.target = Some("< 30 s (release)".into());
    f.note = Some(
        "store + world controllers + S3 and EC2 endpoints; a second copy of the cluster".into(),
    );
    let deletion = nodeclaim_deletion(&cluster, report).await;
    drop(cluster);
    deletion
}

/// How long the simulated Karpenter takes to finish a NodeClaim deletion at scale-5k: from the DELETE
/// to the NodeClaim gone (its finalizer drained the node, waited for volumes, terminated the instance
/// and released the Node), followed by a watch rather than by polling.
async fn nodeclaim_deletion(cluster: &SimCluster, report: &mut Report) -> anyhow::Result<()> {
    const NAME: &str =
        "NodeClaim deletion finished by the simulated Karpenter (DELETE -> NodeClaim gone)";
    let client = Client::try_from(cluster.kube_config())?;
    let gvk = kube::api::GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "nodeclaims");
    let claims: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &ar);
    // A NodeClaim whose Node runs pods (every scale-5k node does): the first by name.
    let list = claims.list(&ListParams::default().limit(1)).await?;
    let Some(claim) = list.items.into_iter().next() else {
        report.skipped(SECTION, NAME, "the scenario has no NodeClaims");
        return Ok(());
    };
    let name = claim.name_any();
    let node = claim
        .data
        .pointer("/status/nodeName")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("")
        .to_string();
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?
        .items
        .len();
    let from = list.metadata.resource_version.unwrap_or_default();
    let stream = claims
        .watch(
            &WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout(290),
            &from,
        )
        .await
        .context("opening a NodeClaim watch")?;
    let started = Instant::now();
    claims
        .delete(&name, &Default::default())
        .await
        .with_context(|| format!("deleting NodeClaim {name}"))?;
    let gone = tokio::time::timeout(FANOUT_TIMEOUT, async {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(WatchEvent::Deleted(_)) = ev {
                return true;
            }
        }
        false
    })
    .await;
    if gone != Ok(true) {
        bail!("NodeClaim {name} was not gone within {FANOUT_TIMEOUT:?} of its deletion");
    }
    let took = started.elapsed();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    if nodes.get_opt(&node).await?.is_some() {
        bail!("NodeClaim {name} is gone but its Node {node} is still there");
    }
    let f = report.add(SECTION, NAME, took.as_secs_f64(), "s");
    f.target = Some("< 10 s".into());
    f.note = Some(format!(
        "node {node} with {on_node} pods drained through pods/eviction, world running"
    ));
    Ok(())
}

fn add_rss(report: &mut Report, what: &str) {
    match rss_mib() {
        Some((rss, peak)) => {
            report
                .add(SECTION, format!("{what}: VmRSS"), rss, "MiB")
                .note = Some("whole bench process: simulator + clients".into());
            report.add(SECTION, format!("{what}: VmHWM (peak)"), peak, "MiB");
        }
        None => report.skipped(SECTION, what, "no /proc/self/status on this system"),
    }
}

async fn full_lists(
    base_url: &str,
    client: &Client,
    http: &reqwest::Client,
    runs: usize,
    pod_count: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::all(client.clone());
    let url = format!("{base_url}/api/v1/pods");
    let (mut typed, mut raw) = (Vec::new(), Vec::new());
    // The first list serializes every pod; the store keeps each one's JSON until it changes.
    let t = Instant::now();
    let mut body_len = raw_list(http, &url).await?;
    let f = report.add(
        SECTION,
        "full pod list, raw reqwest GET /api/v1/pods, first (cold cache)",
        t.elapsed().as_secs_f64() * 1e3,
        "ms",
    );
    f.note = Some("serializes all pods into the store's per-object JSON cache".into());
    for _ in 0..runs {
        let t = Instant::now();
        let list = api.list(&ListParams::default()).await?;
        typed.push(t.elapsed());
        if list.items.len() != pod_count {
            bail!(
                "kube-rs list returned {} pods, the store holds {pod_count}",
                list.items.len()
            );
        }
        drop(list);
        let t = Instant::now();
        body_len = raw_list(http, &url).await?;
        raw.push(t.elapsed());
    }
    let target = Some(("max", "< 2 s"));
    if let Some(s) = Summary::of(&typed) {
        report.add_summary_ms(
            SECTION,
            "full pod list, kube-rs Api::<Pod>::all().list()",
            &s,
            target,
            Some("HTTP + JSON decode into k8s-openapi Pods"),
        );
    }
    if let Some(s) = Summary::of(&raw) {
        report.add_summary_ms(
            SECTION,
            "full pod list, raw reqwest GET /api/v1/pods (cached JSON)",
            &s,
            target,
            Some(&format!(
                "body read, not decoded: {:.0} MiB",
                body_len as f64 / (1024.0 * 1024.0)
            )),
        );
    }
    Ok(())
}

/// GET of a full list, body read but not decoded: its length.
async fn raw_list(http: &reqwest::Client, url: &str) -> anyhow::Result<usize> {
    let body = http
        .get(url)
        .bearer_auth(snapdrain_sim::apiserver::auth::ADMIN_TOKEN)
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    Ok(body.len())
}

async fn paged_lists(
    client: &Client,
    runs: usize,
    pod_count: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::all(client.clone());
    let mut totals = Vec::new();
    let mut pages = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let (mut seen, mut token) = (0, None::<String>);
        pages = 0;
        loop {
            let mut lp = ListParams::default().limit(500);
            if let Some(tok) = &token {
                lp = lp.continue_token(tok);
            }
            let page = api.list(&lp).await?;
            pages += 1;
            seen += page.items.len();
            token = page.metadata.continue_.filter(|c| !c.is_empty());
            if token.is_none() {
                break;
            }
        }
        totals.push(t.elapsed());
        if seen != pod_count {
            bail!("paged list saw {seen} pods, the store holds {pod_count}");
        }
    }
    if let Some(s) = Summary::of(&totals) {
        report.add_summary_ms(
            SECTION,
            "paged pod list, limit=500, all pages, kube-rs",
            &s,
            None,
            Some(&format!("{pages} pages per list")),
        );
    }
    Ok(())
}

/// `watchers` kube-rs watches on all pods, then `updates` pod status writes through the store: how long
/// until every watcher has seen every update.
async fn watch_fanout(
    store: &Store,
    client: &Client,
    opts: &ApiOptions,
    report: &mut Report,
) -> anyhow::Result<()> {
    let key = ResKey::core("pods");
    let (all, _) = store.snapshot(&key);
    let updates = opts.updates.min(all.len());
    if updates == 0 || opts.watchers == 0 {
        report.skipped(SECTION, "watch fan-out", "no pods or no watchers");
        return Ok(());
    }
    // Spread the updated pods over the whole cluster rather than one namespace.
    let step = (all.len() / updates).max(1);
    let targets: Vec<(String, String)> = all
        .iter()
        .step_by(step)
        .take(updates)
        .map(|p| {
            (
                meta_str(p, "namespace").unwrap_or("").to_string(),
                meta_str(p, "name").unwrap_or("").to_string(),
            )
        })
        .collect();
    drop(all);
    let marker = format!("snapdrain-bench-{}", std::process::id());
    // Watches start from the current resourceVersion: no initial list of 150,000 pods per watcher.
    let from = store.current_rv().to_string();
    let api: Api<Pod> = Api::all(client.clone());
    let mut tasks = Vec::new();
    for _ in 0..opts.watchers {
        let stream = api
            .watch(&WatchParams::default().timeout(290), &from)
            .await
            .context("opening a pod watch")?;
        let marker = marker.clone();
        let want = targets.len();
        tasks.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut seen = HashSet::new();
            while let Some(ev) = stream.next().await {
                if let Ok(WatchEvent::Modified(p)) = ev
                    && p.status.as_ref().and_then(|s| s.message.as_deref()) == Some(&marker)
                {
                    seen.insert(p.name_any());
                    if seen.len() == want {
                        return Some(Instant::now());
                    }
                }
            }
            None
        }));
    }
    let store2 = store.clone();
    let targets = Arc::new(targets);
    let writes = targets.clone();
    let start = Instant::now();
    // The writes run off the async workers so that the watch streams are served while they happen.
    let written = tokio::task::spawn_blocking(move || write_updates(&store2, &writes, &marker));
    let written = written.await??;
    let write_time = start.elapsed();
    let mut last = start;
    for t in tasks {
        match tokio::time::timeout(FANOUT_TIMEOUT, t).await {
            Ok(Ok(Some(done))) => last = last.max(done),
            _ => bail!("a watcher did not see all {written} updates within {FANOUT_TIMEOUT:?}"),
        }
    }
    let all_seen = last - start;
    let events = (written * opts.watchers) as f64;
    report
        .add(
            SECTION,
            format!(
                "watch fan-out: {} watchers x {written} pod status updates, until all seen",
                opts.watchers
            ),
            all_seen.as_secs_f64() * 1e3,
            "ms",
        )
        .note = Some(format!(
        "writes alone took {:.0} ms (store.modify, status subresource)",
        write_time.as_secs_f64() * 1e3
    ));
    report.add(
        SECTION,
        "watch fan-out: events delivered and decoded per second",
        events / all_seen.as_secs_f64(),
        "events/s",
    );
    Ok(())
}

fn write_updates(
    store: &Store,
    targets: &[(String, String)],
    marker: &str,
) -> anyhow::Result<usize> {
    let key = ResKey::core("pods");
    let opts = WriteOptions {
        internal: true,
        ..Default::default()
    };
    for (ns, name) in targets {
        store
            .modify(&key, Some(ns), name, Some("status"), opts, |current| {
                let mut pod = current.clone();
                pod["status"]["message"] = json!(marker);
                Ok(pod)
            })
            .map_err(|e| anyhow::anyhow!("updating pod {ns}/{name}: {}", e.message))?;
    }
    Ok(targets.len())
}
