//! `snapdrain bench --only soak`: weeks of plan churn compressed. Thousands of disruptions from every
//! source (Execute plans with and without replacement, `source: manual` runs, Karpenter drift and
//! consolidation, NodeClaim deletion, spot interruptions; [`churn::schedule`]) run a few at a time
//! against the simulated cluster at fast timings, with the controller as its own process and the
//! eviction gate registered. Reported: the controller's RSS through the run and the plans it stores at
//! the end (its history keeper deletes finished plans: the policy's `history.ttlAfterFinished` is set
//! to [`HISTORY_TTL`] to compress days into seconds), its API requests per plan in the first and last
//! deciles, dry-run eviction latency through the gate before and after, and the independent judge's
//! verdict over the whole run (`snapdrain_testkit::chaos::judge`).
//!
//! Capacity comes back as Karpenter's provisioner brings it: when a zone has fewer nodes than it
//! started with, the soak creates a NodeClaim from the NodePool's template in that zone (the simulated
//! Karpenter launches NodeClaims but does not provision for pending pods).

mod churn;

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use http::{HeaderName, HeaderValue};
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::gate::{create, evict_once, register_gate};
use super::report::Report;
use super::scale::rss_of;
use super::sim::{Bench, start_scenario, wait_store};
use super::stats::Summary;
use churn::{Mode, Tally};
use snapdrain_sim::apiserver::admission::ADDRESS_ANNOTATION;
use snapdrain_sim::apiserver::audit::AuditEntry;
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::apiserver::store::{WatchEvent, WriteOptions};
use snapdrain_testkit::chaos::judge::{self, Evidence, Launched};

const SECTION: &str = "soak";
/// Disruptions in a soak unless `--plans` says otherwise.
pub const DEFAULT_PLANS: usize = 2_000;
/// Disruptions in flight at once: half the nodes churning at any moment, to compress weeks.
const PARALLEL: usize = 6;
/// Longest one disruption may take to leave a terminal plan.
const EPISODE_TIMEOUT: Duration = Duration::from_secs(90);
/// The history TTL: days of retention compressed to seconds (the policy's own setting).
const HISTORY_TTL: Duration = Duration::from_secs(20);
/// A spot notice shorter than EC2's two minutes, so a reclaimed instance goes within seconds (the
/// world's fast timings verify a backup in well under a second), but not shorter than any cut can be:
/// EC2 takes one snapshot of a volume per 15 s, and a pod the previous disruption just moved has its
/// volume cut moments ago. At 10 s, 4 of 500 disruptions lost a pod no snapshot could have saved in time
/// (the plan now waits out that window and says so; `snapdrain::planning::snapshot_window`); 25 s is the
/// window, the whole-second rounding and the cut and eviction after it, with room to spare on 2 cores.
const SPOT_NOTICE_MS: u64 = 25_000;
/// Dry-run evictions per gate sample and per kind of pod.
const GATE_SAMPLES: usize = 100;
/// The soak's own requests carry this User-Agent, so the traffic figures count the controller's only.
const DRIVER_AGENT: &str = "snapdrain-soak-driver";
const NS: &str = "snapdrain";
const TERMINAL: &[&str] = &["Completed", "Failed", "Aborted"];
const POLL: Duration = Duration::from_millis(100);

#[derive(Clone, Debug)]
pub struct Options {
    pub plans: usize,
    pub seed: u64,
    /// A built-in scenario (or a scenario file); `quickstart` is grown to twelve nodes.
    pub scenario: String,
}

fn plans_key() -> ResKey {
    ResKey::new("snapdrain.io", "disruptionplans")
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn name_of(v: &Value) -> &str {
    str_at(v, "/metadata/name").unwrap_or_default()
}

fn phase(p: &Value) -> &str {
    str_at(p, "/status/phase").unwrap_or("Pending")
}

fn terminal(p: &Value) -> bool {
    TERMINAL.contains(&phase(p))
}

fn items(b: &Bench, key: &ResKey) -> Vec<Value> {
    b.cluster
        .store
        .snapshot(key)
        .0
        .iter()
        .map(|v| (**v).clone())
        .collect()
}

/// Every plan the run saw, in the order first seen, with its latest state. It follows the store's own
/// change feed from before the controller starts, so no version is missed however long a loop of the
/// soak takes (at scale-5k one look at the pods takes seconds): a plan the gate starts and the history
/// keeper deletes between two looks still counts, with its backups, in the judge's evidence.
struct Seen {
    order: BTreeMap<String, usize>,
    latest: Vec<Value>,
    feed: tokio::sync::broadcast::Receiver<Arc<WatchEvent>>,
    /// Plan changes the feed dropped (it fell behind); then the store's current plans are read instead,
    /// and a plan that came and went in between is missing from the evidence.
    missed: u64,
    /// When each plan (by uid) first reached the store, stamped by a task of its own on another
    /// subscription: a round of the soak's loop takes seconds at scale-5k, too coarse a clock.
    stamps: Arc<std::sync::Mutex<BTreeMap<String, Instant>>>,
}

impl Seen {
    fn follow(b: &Bench) -> Self {
        let (now, feed) = b.cluster.store.subscribe(&plans_key());
        let (_, mut stamp_feed) = b.cluster.store.subscribe(&plans_key());
        let stamps: Arc<std::sync::Mutex<BTreeMap<String, Instant>>> = Arc::default();
        let stamping = stamps.clone();
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match stamp_feed.recv().await {
                    Ok(e) => {
                        if let Some(uid) = str_at(&e.object, "/metadata/uid") {
                            stamping
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .entry(uid.to_string())
                                .or_insert_with(Instant::now);
                        }
                    }
                    // A plan missed here has no stamp: its episode counts as having none yet.
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return,
                }
            }
        });
        let mut seen = Self {
            order: BTreeMap::new(),
            latest: Vec::new(),
            feed,
            missed: 0,
            stamps,
        };
        for p in now {
            seen.record(&p);
        }
        seen
    }

    /// Keyed by uid: a node's plan name is deterministic, so a plan the history keeper deleted can come
    /// back under its name (a later signal for the node) and would otherwise overwrite the first one's
    /// record, backups and all (seen at scale-5k: 5 evictions judged uncovered whose backups had
    /// completed and verified under the earlier plan of that name).
    fn record(&mut self, p: &Value) {
        let key = str_at(p, "/metadata/uid")
            .map(str::to_string)
            .unwrap_or_else(|| name_of(p).to_string());
        match self.order.get(&key) {
            Some(&i) => self.latest[i] = p.clone(),
            None => {
                self.order.insert(key, self.latest.len());
                self.latest.push(p.clone());
            }
        }
    }

    fn refresh(&mut self, b: &Bench) {
        use tokio::sync::broadcast::error::TryRecvError;
        loop {
            match self.feed.try_recv() {
                // A deleted plan's event carries its last state.
                Ok(e) => self.record(&e.object),
                Err(TryRecvError::Lagged(n)) => {
                    self.missed += n;
                    for p in b.cluster.store.snapshot(&plans_key()).0 {
                        self.record(&p);
                    }
                }
                Err(TryRecvError::Empty | TryRecvError::Closed) => return,
            }
        }
    }

    fn len(&self) -> usize {
        self.latest.len()
    }

    /// When `p` first reached the store.
    fn first_at(&self, p: &Value) -> Option<Instant> {
        let uid = str_at(p, "/metadata/uid")?;
        self.stamps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(uid)
            .copied()
    }

    fn since(&self, first: usize) -> &[Value] {
        &self.latest[first.min(self.latest.len())..]
    }
}

/// One disruption in flight.
struct Episode {
    mode: Mode,
    node: Option<String>,
    started: Instant,
    /// Plans seen before it started: its plan comes after.
    first: usize,
    /// A consolidation's NodePool is closed again (`consolidateAfter: Never`).
    closed: bool,
    /// When its first plan was seen, after `started`.
    first_plan: Option<Duration>,
}

fn covers(p: &Value, node: &str) -> bool {
    p.pointer("/spec/nodes")
        .and_then(Value::as_array)
        .is_some_and(|ns| ns.iter().any(|n| n == node))
}

impl Episode {
    /// The plans it made: for its node, or the consolidation plans since it opened the pool.
    fn plans<'a>(&self, seen: &'a Seen) -> Vec<&'a Value> {
        let since = seen.since(self.first).iter();
        match &self.node {
            Some(node) => since.filter(|p| covers(p, node)).collect(),
            None => since
                .filter(|p| str_at(p, "/spec/reason") == Some("Consolidatable"))
                .collect(),
        }
    }

    /// Whether a consolidation should close its pool now: Karpenter consolidated a node (one of its
    /// plans ended), or nothing came of it.
    fn should_close(&self, seen: &Seen) -> bool {
        let mine = self.plans(seen);
        self.mode == Mode::Consolidation
            && !self.closed
            && (mine.iter().any(|p| terminal(p))
                || (mine.is_empty() && self.started.elapsed() > Duration::from_secs(30)))
    }

    /// `Some(outcome)` once it is over; `pods` says what stands on its node when it timed out.
    fn outcome(&self, seen: &Seen, pods: impl Fn(&str) -> String) -> Option<String> {
        let mine = self.plans(seen);
        let open_pool = self.mode == Mode::Consolidation && !self.closed;
        if !open_pool && !mine.is_empty() && mine.iter().all(|p| terminal(p)) {
            let mut phases: Vec<&str> = mine.iter().map(|p| phase(p)).collect();
            phases.sort();
            phases.dedup();
            return Some(phases.join("+"));
        }
        if self.closed && mine.is_empty() {
            return Some("no plan".into());
        }
        (self.started.elapsed() > EPISODE_TIMEOUT).then(|| {
            let why: Vec<String> = mine
                .iter()
                .filter(|p| !terminal(p))
                .map(|p| {
                    format!(
                        "{} {}: {}",
                        name_of(p),
                        phase(p),
                        str_at(p, "/status/message").unwrap_or_default()
                    )
                })
                .collect();
            let why = if mine.is_empty() {
                "no plan covers the node".to_string()
            } else {
                why.join(" | ")
            };
            format!(
                "timed out: {why}; on the node: {}; not Running elsewhere: {}",
                self.node.as_deref().map(&pods).unwrap_or_default(),
                pods("")
            )
        })
    }
}

/// The controller process, and the directory of the kubeconfig it reads.
struct Controller {
    child: tokio::process::Child,
    pid: u32,
    _dir: tempfile::TempDir,
}

pub async fn run(opts: &Options, report: &mut Report) -> anyhow::Result<()> {
    let (mut scenario, label) = snapdrain_sim::scenario::resolve(&opts.scenario)?;
    scenario.timeline.clear();
    if opts.scenario == "quickstart" {
        // Four nodes a zone and a protected replica more per set: a disruption always finds a node with
        // protected pods beside another of its zone.
        if let Some(group) = scenario.nodes.first_mut() {
            group.count = Some(12);
        }
        for set in &mut scenario.stateful_sets {
            set.replicas += 1;
        }
    }
    // Karpenter consolidates only when a consolidation disruption opens the pool for a moment.
    // Half the nodes may be disrupting at once (Karpenter's default budget, 10%, is one node of twelve,
    // and a spot-reclaimed node holds it until EC2 takes the instance): the soak's episodes overlap.
    // Pools the scenario only names (scale-5k's `default`) are declared first, or they would keep
    // Karpenter's `consolidateAfter: 30s` and consolidate on their own from the start.
    scenario.node_pools = scenario.node_pools_in_use();
    for pool in &mut scenario.node_pools {
        pool.consolidate_after = "Never".into();
        pool.consolidation_policy = "WhenEmptyOrUnderutilized".into();
        pool.budgets = Some(vec![json!({"nodes": "50%"})]);
    }
    // Karpenter reads EC2's spot interruption warnings (its Helm chart's settings.interruptionQueue).
    scenario
        .karpenter
        .get_or_insert_default()
        .interruption_queue = Some("soak".into());
    let label = format!("{label}, {} nodes", count_nodes(&scenario));
    let b = start_scenario(scenario, &label, snapdrain_testkit::harness::fast_timings()).await?;
    wait_store(
        &b.cluster.store,
        &ResKey::new("apps", "statefulsets"),
        "every StatefulSet ready",
        Duration::from_secs(120),
        |sets| {
            !sets.is_empty()
                && sets
                    .iter()
                    .all(|s| s.pointer("/status/readyReplicas") == s.pointer("/spec/replicas"))
        },
    )
    .await?;
    let driver = driver_client(&b, true)?;
    let gate_client = driver_client(&b, false)?;
    let protected: BTreeMap<String, BTreeSet<String>> =
        snapdrain_testkit::safety::protected_pods(&items(&b, &ResKey::core("pods")));
    if protected.is_empty() {
        bail!("scenario {label} runs no protected pod (a StatefulSet pod with a volume)");
    }
    let protected_names: BTreeSet<String> = protected.keys().cloned().collect();
    let mut seen = Seen::follow(&b);
    install_policy_and_gate(&driver).await?;
    let mut controller = start_controller(&b, &driver).await?;
    let result = soak(
        opts,
        &label,
        &b,
        &driver,
        &gate_client,
        &protected,
        &protected_names,
        &controller,
        &mut seen,
        report,
    )
    .await;
    super::scale::stop_controller(&mut controller.child, controller.pid).await;
    if let Ok(path) = std::env::var(AUDIT_FILE_ENV) {
        seen.refresh(&b);
        // Said, not returned: the soak's own result (its failure, if any) is what the run reports.
        if let Err(e) = write_evidence(&b, &seen, std::path::Path::new(&path)) {
            eprintln!("soak: could not write the evidence for {AUDIT_FILE_ENV}: {e:#}");
        }
    }
    result
}

/// A diagnosis: `SNAPDRAIN_SOAK_AUDIT=<file>` writes the simulator's whole audit log there (one JSON
/// entry a line) and every plan in its last seen state beside it (`audit.jsonl` → `audit.plans.json`),
/// whether the soak passed or not, for reading a violation's story afterwards (`jq`, a script).
const AUDIT_FILE_ENV: &str = "SNAPDRAIN_SOAK_AUDIT";

fn write_evidence(b: &Bench, seen: &Seen, path: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for e in b.cluster.audit.since(0) {
        serde_json::to_writer(&mut out, &e)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    let plans = path.with_extension("plans.json");
    std::fs::write(&plans, serde_json::to_vec(&seen.latest)?)
        .with_context(|| format!("writing {}", plans.display()))?;
    eprintln!(
        "soak: audit log in {}, plans in {}",
        path.display(),
        plans.display()
    );
    Ok(())
}

fn count_nodes(s: &snapdrain_sim::scenario::format::Scenario) -> u32 {
    s.nodes.iter().map(|g| g.count.unwrap_or(1)).sum()
}

/// A client for the soak's own requests, marked by its User-Agent (and without kube's retries for the
/// gate's 429s when `retry` is false).
fn driver_client(b: &Bench, retry: bool) -> anyhow::Result<Client> {
    let mut cfg = b.cluster.kube_config();
    cfg.headers.push((
        HeaderName::from_static("user-agent"),
        HeaderValue::from_static(DRIVER_AGENT),
    ));
    cfg.default_retry = retry;
    Ok(Client::try_from(cfg)?)
}

/// The policy (short history, consolidation released, a short release window so a Release plan whose
/// disruptor never comes ends within the run) and the gate's registration.
async fn install_policy_and_gate(client: &Client) -> anyhow::Result<()> {
    snapdrain_testkit::harness::install_plan_crd(client)
        .await
        .context("installing the DisruptionPolicy CRD")?;
    let ttl = format!("{}s", HISTORY_TTL.as_secs());
    let policy: snapdrain::api::DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"},
        "spec": {"releaseWindow": "10s", "history": {"ttlAfterFinished": ttl, "keepPerNode": 1},
                 "signals": {"consolidation": "Release"}}
    }))?;
    Api::<snapdrain::api::DisruptionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .context("creating the DisruptionPolicy")?;
    register_gate(client).await?;
    Ok(())
}

/// `snapdrain controller` as its own process (as in a cluster), serving the gate on a free port.
async fn start_controller(b: &Bench, client: &Client) -> anyhow::Result<Controller> {
    // A free port for the gate (the simulated API server finds it through the Service's annotation).
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr = format!("127.0.0.1:{port}");
    create(
        &Api::<Service>::namespaced(client.clone(), NS),
        json!({"metadata": {"name": "snapdrain-webhook", "annotations": {ADDRESS_ANNOTATION: addr}},
               "spec": {"ports": [{"port": 443}]}}),
        "the webhook Service",
    )
    .await?;
    let ec2 = b
        .cluster
        .ec2
        .as_ref()
        .ok_or_else(|| anyhow!("the simulated world runs no EC2 endpoint"))?;
    let join = snapdrain_sim::cluster::cluster_join(&b.cluster.url(), b.cluster.ca_pem());
    let dir = tempfile::tempdir()?;
    let kubeconfig = b.cluster.write_kubeconfig(&dir.path().join("kubeconfig"))?;
    // A diagnosis: SNAPDRAIN_SOAK_CONTROLLER_LOG is the controller's RUST_LOG, and every line it logs
    // is passed on (otherwise only its errors are).
    let log_filter = std::env::var("SNAPDRAIN_SOAK_CONTROLLER_LOG").ok();
    let pass_all = log_filter.is_some();
    let mut child = super::scale::controller_command()?
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--no-leader-election", "--metrics-addr", "127.0.0.1:0"])
        .args(["--webhook-addr", &addr, "--webhook-namespace", NS])
        .args(["--ec2-endpoint", &ec2.endpoint()])
        .args(["--region", &ec2.config().region])
        .args(["--cluster-name", &join.cluster_name])
        .args(["--api-server", &join.api_server])
        .args(["--cluster-certificate", &join.cluster_certificate])
        .env(
            "RUST_LOG",
            log_filter.as_deref().unwrap_or("snapdrain=warn"),
        )
        .env("AWS_ACCESS_KEY_ID", "sim")
        .env("AWS_SECRET_ACCESS_KEY", "sim")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting `snapdrain controller`")?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("the controller exited at once"))?;
    let pid = super::scale::innermost(pid);
    // Keep reading its log so the pipe never fills and blocks it; the last lines explain a failure.
    let logs = child.stderr.take().context("the controller's stderr")?;
    tokio::spawn(async move {
        let mut lines = BufReader::new(logs).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if pass_all || line.contains("\"ERROR\"") {
                eprintln!("controller: {line}");
            }
        }
    });
    Ok(Controller {
        child,
        pid,
        _dir: dir,
    })
}

/// How often the start-up wait looks at the pods: at scale-5k a look scans 150,000 of them, and the
/// controller's hold patches come by the thousand, so a look per store event would be the bench's own
/// quadratic load, not the controller's.
const HELD_LOOK_EVERY: Duration = Duration::from_millis(250);

/// Waits until every protected pod carries Karpenter's do-not-disrupt hold; answers how long it took.
/// The limit grows with the pods to hold (the controller patches each one).
async fn all_held(
    store: &snapdrain_sim::apiserver::store::Store,
    protected_names: &BTreeSet<String>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let limit = Duration::from_secs(120) + Duration::from_millis(20) * protected_names.len() as u32;
    let held = || {
        store
            .snapshot(&ResKey::core("pods"))
            .0
            .iter()
            .filter(|p| {
                p.pointer("/metadata/annotations/karpenter.sh~1do-not-disrupt")
                    == Some(&json!("true"))
            })
            .filter(|p| {
                protected_names.contains(&format!(
                    "{}/{}",
                    str_at(p, "/metadata/namespace").unwrap_or_default(),
                    name_of(p)
                ))
            })
            .count()
    };
    let mut tick = tokio::time::interval(HELD_LOOK_EVERY);
    loop {
        tick.tick().await;
        let n = held();
        if n == protected_names.len() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            bail!(
                "every protected pod held by the controller: {n} of {} within {limit:?}",
                protected_names.len()
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn soak(
    opts: &Options,
    label: &str,
    b: &Bench,
    driver: &Client,
    gate_client: &Client,
    protected: &BTreeMap<String, BTreeSet<String>>,
    protected_names: &BTreeSet<String>,
    controller: &Controller,
    seen: &mut Seen,
    report: &mut Report,
) -> anyhow::Result<()> {
    let store = &b.cluster.store;
    // Ready: every protected pod held, and the gate's caBundle written.
    let held_in = all_held(store, protected_names).await?;
    let f = report.add(
        SECTION,
        "every protected pod held at start",
        held_in.as_secs_f64(),
        "s",
    );
    f.note = Some(format!(
        "{} protected pods, looked at every {} ms",
        protected_names.len(),
        HELD_LOOK_EVERY.as_millis()
    ));
    wait_store(
        store,
        &ResKey::new(
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
        ),
        "the gate's caBundle",
        Duration::from_secs(60),
        |c| {
            c.iter().any(|w| {
                w.pointer("/webhooks/0/clientConfig/caBundle")
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty())
            })
        },
    )
    .await?;
    let rss_start = rss_of(controller.pid).map(|(r, _)| r);
    let gate_start = gate_sample(b, gate_client, protected_names).await;
    let zones: Vec<String> = items(b, &ResKey::core("nodes"))
        .iter()
        .filter_map(|n| churn::zone_of(n).map(str::to_string))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let per_zone_target = open_per_zone(&items(b, &ResKey::core("nodes")));
    let instance_type = items(b, &ResKey::core("nodes"))
        .iter()
        .find(|n| churn::owned_by_nodeclaim(n))
        .and_then(|n| str_at(n, "/metadata/labels/node.kubernetes.io~1instance-type"))
        .unwrap_or("m6i.xlarge")
        .to_string();

    let schedule = churn::schedule(opts.seed, opts.plans);
    let ends = churn::decile_ends(opts.plans);
    let mut rng = snapdrain_testkit::chaos::rng::Rng::new(opts.seed ^ 0x50a4);
    let mut in_flight: Vec<Episode> = Vec::new();
    let mut next = 0usize;
    let mut blocked_since: Option<Instant> = None;
    let mut skipped: Vec<String> = Vec::new();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut timed_out: Vec<String> = Vec::new();
    let mut audit_at = b.cluster.audit.since(0).len() as u64;
    // Per decile: the plans first seen in it, its requests and how long it lasted.
    let mut deciles: Vec<(usize, Tally, Duration)> = Vec::new();
    let mut decile_from = Instant::now();
    let mut current = Tally::new();
    let mut plans_at_cut = 0usize;
    let mut rss_samples: Vec<(usize, usize, f64)> = Vec::new();
    let mut durations: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    // Forceful disruptions: how soon their plan was seen, and how many never had one.
    let mut to_plan: BTreeMap<&'static str, (Vec<Duration>, usize)> = BTreeMap::new();
    let mut claims: BTreeMap<String, (usize, Instant)> = BTreeMap::new();
    let mut claim_seq = 0u64;
    let started = Instant::now();
    loop {
        seen.refresh(b);
        // Traffic since the last look, into the decile it belongs to.
        let fresh = b.cluster.audit.since(audit_at);
        audit_at += fresh.len() as u64;
        tally(&fresh, &mut current);
        // A decile ends once its last disruption started: its requests over the plans first seen in it.
        while deciles.len() < ends.len() - 1 && next >= ends[deciles.len()] {
            let plans = seen.len() - plans_at_cut;
            plans_at_cut = seen.len();
            deciles.push((plans, std::mem::take(&mut current), decile_from.elapsed()));
            decile_from = Instant::now();
            // Deciles that close together (a short run starts several disruptions at once) share one
            // sample and one progress line.
            if rss_samples.last().is_some_and(|(at, _, _)| *at == next) {
                continue;
            }
            if let Some((rss, _)) = rss_of(controller.pid) {
                rss_samples.push((next, seen.len(), rss));
            }
            eprintln!(
                "soak: {next} of {} disruptions started, {} plans seen, {:.0} s",
                schedule.len(),
                seen.len(),
                started.elapsed().as_secs_f64()
            );
        }
        for e in in_flight.iter_mut() {
            if e.first_plan.is_none()
                && let Some(at) = e.plans(seen).iter().filter_map(|p| seen.first_at(p)).min()
            {
                e.first_plan = Some(at.saturating_duration_since(e.started));
            }
            if e.should_close(seen) {
                set_consolidate_after(driver, "Never").await?;
                e.closed = true;
            }
        }
        // Episodes that ended.
        let mut i = 0;
        while i < in_flight.len() {
            if let Some(outcome) = in_flight[i].outcome(seen, |node| pods_on(b, node)) {
                let e = in_flight.remove(i);
                if e.mode == Mode::Consolidation && !e.closed {
                    set_consolidate_after(driver, "Never").await?;
                }
                durations
                    .entry(e.mode.as_str())
                    .or_default()
                    .push(e.started.elapsed());
                if e.mode.forceful() {
                    let (seen_at, none) = to_plan.entry(e.mode.as_str()).or_default();
                    match e.first_plan {
                        Some(d) => seen_at.push(d),
                        None => *none += 1,
                    }
                }
                if outcome.starts_with("timed out") {
                    timed_out.push(format!(
                        "{} {}: {outcome}",
                        e.mode.as_str(),
                        e.node.as_deref().unwrap_or("-")
                    ));
                }
                let key = if outcome.starts_with("timed out") {
                    "timed out"
                } else {
                    outcome.as_str()
                };
                *outcomes
                    .entry(format!("{} {key}", e.mode.as_str()))
                    .or_default() += 1;
            } else {
                i += 1;
            }
        }
        refill(
            b,
            &zones,
            &per_zone_target,
            &instance_type,
            &mut claims,
            &mut claim_seq,
        )?;
        // New episodes, in schedule order.
        while in_flight.len() < PARALLEL && next < schedule.len() {
            let mode = schedule[next];
            match start_episode(
                b,
                driver,
                mode,
                next,
                seen,
                &in_flight,
                protected_names,
                &mut rng,
            )
            .await
            {
                Err(e) => {
                    // One disruption the cluster refused is reported, not the end of the soak.
                    skipped.push(format!("{} #{next}: {e:#}", mode.as_str()));
                    next += 1;
                }
                Ok(Some(e)) => {
                    in_flight.push(e);
                    next += 1;
                    blocked_since = None;
                }
                Ok(None) => {
                    let since = *blocked_since.get_or_insert_with(Instant::now);
                    if in_flight.is_empty() && since.elapsed() > Duration::from_secs(60) {
                        skipped.push(format!("{} #{next}: no node to take", mode.as_str()));
                        next += 1;
                        blocked_since = None;
                        continue;
                    }
                    break;
                }
            }
        }
        if next >= schedule.len() && in_flight.is_empty() {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let churn_time = started.elapsed();
    // Every plan over, then the history keeper's sweep of what is past its TTL.
    let settle_deadline = Instant::now() + Duration::from_secs(180);
    loop {
        seen.refresh(b);
        let stored = items(b, &plans_key());
        let live: BTreeSet<String> = items(b, &ResKey::core("nodes"))
            .iter()
            .map(|n| name_of(n).to_string())
            .collect();
        let running = stored.iter().any(|p| !terminal(p));
        let overdue = stored.iter().any(|p| past_ttl(p, &live));
        if (!running && !overdue) || Instant::now() > settle_deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let fresh = b.cluster.audit.since(audit_at);
    tally(&fresh, &mut current);
    deciles.push((seen.len() - plans_at_cut, current, decile_from.elapsed()));
    let (rss_end, peak) = rss_of(controller.pid).map_or((None, None), |(r, p)| (Some(r), Some(p)));
    let stored_end = items(b, &plans_key()).len();
    let gate_end = gate_sample(b, gate_client, protected_names).await;

    // The judge, over every plan the run saw and everything the simulator recorded.
    let audit = b.cluster.audit.since(0);
    let instances = Launched::all_of(&b.cluster);
    let snapshots = snapdrain_testkit::safety::Ec2Snapshot::all_of(&b.cluster);
    let verdict = judge::judge(&Evidence {
        audit: &audit,
        protected,
        plans: &seen.latest,
        backups: &items(b, &ResKey::new("velero.io", "backups")),
        instances: &instances,
        pods: &items(b, &ResKey::core("pods")),
        nodes: &items(b, &ResKey::core("nodes")),
        pvs: &items(b, &ResKey::core("persistentvolumes")),
        snapshots: &snapshots,
        csi_cuts: &snapdrain_testkit::safety::csi_cuts_of(&b.cluster),
    });

    // Figures.
    let scenario_note = format!(
        "scenario {label}; seed {}; {} disruptions scheduled, {PARALLEL} at a time; fast world timings; history.ttlAfterFinished {}s, keepPerNode 1",
        opts.seed,
        opts.plans,
        HISTORY_TTL.as_secs()
    );
    let f = report.add(SECTION, "plans run", seen.len() as f64, "plans");
    f.note = Some(format!(
        "{scenario_note}; churn {:.0} s; outcomes: {}{}",
        churn_time.as_secs_f64(),
        outcomes
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        if skipped.is_empty() {
            String::new()
        } else {
            format!("; skipped: {}", skipped.join("; "))
        }
    ));
    for (mode, ds) in &durations {
        if let Some(sum) = Summary::of(ds) {
            report
                .add(
                    SECTION,
                    format!(
                        "{mode}: disruption started -> its plans terminal (p50, n={})",
                        sum.n
                    ),
                    sum.p50.as_secs_f64(),
                    "s",
                )
                .note = Some(format!(
                "p99 {:.1} s, max {:.1} s",
                sum.p99.as_secs_f64(),
                sum.max.as_secs_f64()
            ));
        }
    }
    for (mode, (ds, none)) in &to_plan {
        let Some(sum) = Summary::of(ds) else {
            continue;
        };
        report
            .add(
                SECTION,
                format!(
                    "{mode}: disruption started -> its first plan seen (p50, n={})",
                    sum.n
                ),
                sum.p50.as_secs_f64(),
                "s",
            )
            .note = Some(format!(
            "p99 {:.2} s, max {:.2} s; the plan's arrival in the simulated API server's store; {none} with no plan at all",
            sum.p99.as_secs_f64(),
            sum.max.as_secs_f64(),
        ));
    }
    if let Some(r) = rss_start {
        report
            .add(
                SECTION,
                "controller RSS at the start (caches synced, gate up)",
                r,
                "MiB",
            )
            .note = Some(format!(
            "before the first plan; {}",
            super::scale::controller_binary_note()
        ));
    }
    for (started, plans, rss) in &rss_samples {
        report.add(
            SECTION,
            format!("controller RSS after {started} disruptions ({plans} plans)"),
            *rss,
            "MiB",
        );
    }
    if let Some(r) = rss_end {
        let f = report.add(SECTION, "controller RSS at the end", r, "MiB");
        f.target = Some("< 256 MiB at scale-5k".into());
        f.note = Some(format!(
            "every plan over and past-TTL plans swept; peak (VmHWM) {}",
            peak.map_or("unknown".into(), |p| format!("{p:.0} MiB"))
        ));
    }
    report
        .add(
            SECTION,
            "plans stored at the end",
            stored_end as f64,
            "plans",
        )
        .note = Some(format!(
        "of {} run: the history keeper deleted the rest ({}s TTL; the newest plan of each live node kept)",
        seen.len(),
        HISTORY_TTL.as_secs()
    ));
    let first = deciles.first();
    let last = deciles.last();
    // Per plan, a decile's requests are over the plans first seen in it, while plans run across
    // deciles: a decile that starts few plans and waits out long ones reads high. Per second and over
    // the whole run say whether traffic grows.
    let all: u64 = deciles
        .iter()
        .map(|(_, t, _)| t.values().sum::<u64>())
        .sum();
    report
        .add(
            SECTION,
            "controller API requests per plan, whole run",
            all as f64 / seen.len().max(1) as f64,
            "req/plan",
        )
        .note = Some(format!("{all} requests, {} plans", seen.len()));
    for (which, d) in [("first", first), ("last", last)] {
        if let Some((plans, t, took)) = d {
            report
                .add(
                    SECTION,
                    format!("controller API requests per plan, {which} decile"),
                    churn::per_plan(t, *plans),
                    "req/plan",
                )
                .note = Some(format!(
                "{plans} plans; by verb: {}",
                churn::by_verb(t, *plans, 6)
            ));
            report
                .add(
                    SECTION,
                    format!("controller API requests per second, {which} decile"),
                    t.values().sum::<u64>() as f64 / took.as_secs_f64().max(0.001),
                    "req/s",
                )
                .note = Some(format!("over {:.0} s", took.as_secs_f64()));
        }
    }
    for (when, sample) in [("start", gate_start), ("end", gate_end)] {
        match sample {
            Ok((held, allowed)) => {
                for (what, s) in [("held (429)", held), ("allowed", allowed)] {
                    if let Some(s) = Summary::of(&s) {
                        report.add_summary_ms(
                            SECTION,
                            &format!(
                                "dry-run eviction {what} through the gate, {when} of the soak"
                            ),
                            &s,
                            None,
                            Some("sequential, through the simulated API server, webhook over TLS"),
                        );
                    }
                }
            }
            Err(e) => report.skipped(
                SECTION,
                format!("gate latency, {when} of the soak"),
                format!("failed: {e:#}"),
            ),
        }
    }
    let listed = |v: &[String]| {
        (!v.is_empty()).then(|| v.iter().take(5).cloned().collect::<Vec<_>>().join("; "))
    };
    let f = report.add(
        SECTION,
        "safety violations (protected pod evicted, or lost with its node, before its verified backup)",
        verdict.violations.len() as f64,
        "count",
    );
    f.target = Some("0".into());
    f.note = listed(&verdict.violations).or(Some(
        "snapdrain_testkit::chaos::judge over the whole audit log".into(),
    ));
    if seen.missed > 0 {
        // The evidence lacks plan versions: a backup only they recorded is unknown to the judge.
        let note = f.note.take().unwrap_or_default();
        f.note = Some(format!(
            "{} plan change(s) dropped by the store's feed (the evidence may lack backups); {note}",
            seen.missed
        ));
    }
    report
        .add(
            SECTION,
            "of which protected pods lost with their node (no eviction, no backup taken while it ran there)",
            verdict.lost_with_node as f64,
            "count",
        )
        .target = Some("0".into());
    report
        .add(
            SECTION,
            "protected pods let go (a forceful signal's plan failed)",
            verdict.let_go.len() as f64,
            "count",
        )
        .note = listed(&verdict.let_go);
    let f = report.add(SECTION, "terminal plans", verdict.terminal_percent(), "%");
    f.target = Some("100".into());
    f.note = Some(format!(
        "{} of {}, {} Completed{}",
        verdict.terminal,
        verdict.plans,
        verdict.completed,
        listed(&verdict.not_terminal)
            .map(|l| format!("; not terminal: {l}"))
            .unwrap_or_default()
    ));
    let dup: Vec<String> = verdict
        .duplicate_backups
        .iter()
        .chain(&verdict.duplicate_instances)
        .cloned()
        .collect();
    let f = report.add(
        SECTION,
        "duplicate backups + instances",
        dup.len() as f64,
        "count",
    );
    f.target = Some("0".into());
    f.note = listed(&dup);
    let holds: Vec<String> = verdict
        .holds_lost
        .iter()
        .map(|h| format!("lost {h}"))
        .chain(
            verdict
                .holds_orphaned
                .iter()
                .map(|h| format!("orphaned {h}")),
        )
        .collect();
    let f = report.add(
        SECTION,
        "holds lost + orphaned at the end",
        holds.len() as f64,
        "count",
    );
    f.target = Some("0".into());
    f.note = listed(&holds).map(|n| {
        let velero: Vec<String> = verdict
            .holds_orphaned
            .iter()
            .filter_map(|h| velero_pod_state(b, h))
            .collect();
        if velero.is_empty() {
            n
        } else {
            format!("{n}; {}", velero.join("; "))
        }
    });
    let f = report.add(
        SECTION,
        "disruptions timed out",
        timed_out.len() as f64,
        "count",
    );
    f.note = listed(&timed_out);
    Ok(())
}

/// A finished plan the history should have deleted by now: ended more than the TTL and a margin ago,
/// and not the newest of a live node (approximated: none of its nodes is live).
fn past_ttl(p: &Value, live: &BTreeSet<String>) -> bool {
    let Some(ended) =
        str_at(p, "/status/phaseStartedAt").and_then(|t| t.parse::<jiff::Timestamp>().ok())
    else {
        return false;
    };
    let age = jiff::Timestamp::now().duration_since(ended);
    let nodes_gone = p
        .pointer("/spec/nodes")
        .and_then(Value::as_array)
        .is_none_or(|ns| {
            ns.iter()
                .all(|n| n.as_str().is_none_or(|n| !live.contains(n)))
        });
    terminal(p) && nodes_gone && age.as_secs() > HISTORY_TTL.as_secs() as i64 + 10
}

/// For an orphaned hold on a Velero pod (a PodVolumeBackup's hosting pod, named after it): where the
/// pod is bound and whether that node still exists, its PodVolumeBackup's phase and its Backup's.
fn velero_pod_state(b: &Bench, orphaned: &str) -> Option<String> {
    let pod = orphaned.strip_prefix("pod velero/")?.split(' ').next()?;
    let store = &b.cluster.store;
    let get = |key: ResKey, name: &str| store.get(&key, Some("velero"), name).map(|v| (*v).clone());
    let pod_obj = get(ResKey::core("pods"), pod);
    let node = pod_obj
        .as_ref()
        .and_then(|p| str_at(p, "/spec/nodeName").map(str::to_string));
    let node_exists = node
        .as_deref()
        .is_some_and(|n| store.get(&ResKey::core("nodes"), None, n).is_some());
    let pvb = get(ResKey::new("velero.io", "podvolumebackups"), pod);
    let backup_name = pvb.as_ref().and_then(|v| {
        v.pointer("/metadata/labels/velero.io~1backup-name")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    let backup = backup_name
        .as_deref()
        .and_then(|n| get(ResKey::new("velero.io", "backups"), n));
    let phase = |v: &Option<Value>| {
        v.as_ref()
            .and_then(|v| str_at(v, "/status/phase").map(str::to_string))
            .unwrap_or_else(|| "(none)".into())
    };
    Some(format!(
        "{pod}: bound to {} ({}), PodVolumeBackup {}, Backup {} {}",
        node.as_deref().unwrap_or("no node"),
        if node_exists { "exists" } else { "gone" },
        phase(&pvb),
        backup_name.as_deref().unwrap_or("(unknown)"),
        phase(&backup)
    ))
}

/// The pods on `node` with their holds, for a disruption that did not end (`""`: the pods not Running).
fn pods_on(b: &Bench, node: &str) -> String {
    items(b, &ResKey::core("pods"))
        .iter()
        .filter(|p| match node {
            "" => str_at(p, "/status/phase") != Some("Running"),
            n => str_at(p, "/spec/nodeName") == Some(n),
        })
        .filter(|p| !super::sim::owned_by(p, "DaemonSet"))
        .map(|p| {
            let a = |k: &str| {
                p.pointer("/metadata/annotations")
                    .and_then(|a| a.get(k))
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_string()
            };
            format!(
                "{}/{} {}{} do-not-disrupt={} held={}",
                str_at(p, "/metadata/namespace").unwrap_or_default(),
                name_of(p),
                str_at(p, "/status/phase").unwrap_or_default(),
                if p.pointer("/metadata/deletionTimestamp").is_some() {
                    " terminating"
                } else {
                    ""
                },
                a("karpenter.sh/do-not-disrupt"),
                a("snapdrain.io/held")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The controller's requests (those with its User-Agent: the soak's own, Karpenter's and the other
/// drainers' are not snapdrain's traffic), by verb.
fn tally(entries: &[AuditEntry], into: &mut Tally) {
    for e in entries.iter().filter(|e| {
        e.source == "api" && e.user_agent.as_deref() == Some(snapdrain::controller::run::USER_AGENT)
    }) {
        *into.entry(e.verb.clone()).or_default() += 1;
    }
}

fn open_per_zone(nodes: &[Value]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for n in nodes
        .iter()
        .filter(|n| n.pointer("/metadata/deletionTimestamp").is_none())
    {
        *out.entry(churn::zone_of(n).unwrap_or_default().to_string())
            .or_default() += 1;
    }
    out
}

/// Karpenter's provisioner, as far as the soak needs it: a zone with fewer nodes (not deleting) than it
/// started with, counting NodeClaims still launching, gets a NodeClaim from the NodePool's template.
fn refill(
    b: &Bench,
    zones: &[String],
    target: &BTreeMap<String, usize>,
    instance_type: &str,
    claims: &mut BTreeMap<String, (usize, Instant)>,
    seq: &mut u64,
) -> anyhow::Result<()> {
    let nodes = items(b, &ResKey::core("nodes"));
    let owners: BTreeSet<&str> = nodes
        .iter()
        .flat_map(|n| {
            n.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|r| r["name"].as_str())
        })
        .collect();
    claims.retain(|name, (_, at)| {
        !owners.contains(name.as_str()) && at.elapsed() < Duration::from_secs(60)
    });
    let have = open_per_zone(&nodes);
    let pool_key = ResKey::new("karpenter.sh", "nodepools");
    for (i, zone) in zones.iter().enumerate() {
        let launching = claims.values().filter(|(z, _)| *z == i).count();
        let want = target.get(zone).copied().unwrap_or(0);
        let count = have.get(zone).copied().unwrap_or(0) + launching;
        for _ in count..want {
            let Some(pool) = b.cluster.store.get(&pool_key, None, "default") else {
                return Ok(());
            };
            *seq += 1;
            let name = churn::claim_name_in_zone(&format!("soak-{seq}"), i, zones.len());
            let mut claim = snapdrain_sim::world::karpenter::nodeclaim_from_pool(&pool);
            claim["metadata"]["name"] = json!(name);
            claim["spec"]["requirements"] = json!([{"key": "node.kubernetes.io/instance-type",
                "operator": "In", "values": [instance_type]}]);
            b.cluster
                .store
                .create(
                    &ResKey::new("karpenter.sh", "nodeclaims"),
                    None,
                    claim,
                    WriteOptions {
                        dry_run: false,
                        internal: true,
                    },
                )
                .map_err(|e| anyhow!("creating NodeClaim {name}: {e:?}"))?;
            claims.insert(name, (i, Instant::now()));
        }
    }
    Ok(())
}

/// The NodePool's `consolidateAfter`, as an operator would set it.
async fn set_consolidate_after(client: &Client, after: &str) -> anyhow::Result<()> {
    let gvk = kube::api::GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool");
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(&gvk, "nodepools"),
    );
    api.patch(
        "default",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"disruption": {"consolidateAfter": after}}})),
    )
    .await
    .with_context(|| format!("setting the NodePool's consolidateAfter to {after}"))?;
    Ok(())
}

/// Starts disruption `i` of `mode`, or None when no node can take it now (or a consolidation runs).
#[allow(clippy::too_many_arguments)]
async fn start_episode(
    b: &Bench,
    client: &Client,
    mode: Mode,
    i: usize,
    seen: &Seen,
    in_flight: &[Episode],
    protected: &BTreeSet<String>,
    rng: &mut snapdrain_testkit::chaos::rng::Rng,
) -> anyhow::Result<Option<Episode>> {
    let first = seen.len();
    if !mode.picks_node() {
        if in_flight.iter().any(|e| e.mode == Mode::Consolidation) {
            return Ok(None);
        }
        set_consolidate_after(client, "1s").await?;
        return Ok(Some(Episode {
            mode,
            node: None,
            started: Instant::now(),
            first,
            closed: false,
            first_plan: None,
        }));
    }
    let busy: BTreeSet<String> = in_flight
        .iter()
        .filter_map(|e| e.node.clone())
        .chain(
            seen.latest
                .iter()
                .filter(|p| !terminal(p))
                .flat_map(|p| {
                    p.pointer("/spec/nodes")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|n| n.as_str().map(str::to_string)),
        )
        .collect();
    // Nodes Karpenter is already taking (a drifted or deleting NodeClaim) are not taken twice.
    let disrupted = items(b, &ResKey::new("karpenter.sh", "nodeclaims"))
        .into_iter()
        .filter(|c| {
            c.pointer("/metadata/deletionTimestamp").is_some()
                || c.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Drifted" && c["status"] == "True")
                    })
        })
        .filter_map(|c| str_at(&c, "/status/nodeName").map(str::to_string));
    let busy: BTreeSet<String> = busy.into_iter().chain(disrupted).collect();
    let nodes = items(b, &ResKey::core("nodes"));
    let pods = items(b, &ResKey::core("pods"));
    let Some(node) = churn::pick_node(mode, &nodes, &pods, protected, &busy, rng.next_u64()) else {
        return Ok(None);
    };
    let name = format!("soak-{i}");
    let plans = Api::<snapdrain::api::DisruptionPlan>::all(client.clone());
    let create = |spec: Value| async move {
        let plan: snapdrain::api::DisruptionPlan = serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": name}, "spec": spec
        }))?;
        plans
            .create(&PostParams::default(), &plan)
            .await
            .with_context(|| format!("creating plan {name}"))?;
        anyhow::Ok(())
    };
    let claim_of = |node: &str| {
        nodes
            .iter()
            .find(|n| name_of(n) == node)
            .and_then(|n| {
                n.pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)?
                    .iter()
                    .find(|r| r["kind"] == "NodeClaim")?
                    .get("name")?
                    .as_str()
                    .map(str::to_string)
            })
            .ok_or_else(|| anyhow!("node {node} has no NodeClaim"))
    };
    match mode {
        Mode::ExecuteReplace => create(snapdrain_testkit::harness::replacing_spec(&node)).await?,
        Mode::Execute => create(json!({"nodes": [node]})).await?,
        Mode::Manual => {
            let mut spec = snapdrain_testkit::harness::replacing_spec(&node);
            spec["source"] = json!("manual");
            spec["replacement"]["when"] = json!("before-drain");
            create(spec).await?;
        }
        Mode::Drift => {
            snapdrain_testkit::karpenter::mark_drifted(client, &claim_of(&node)?)
                .await
                .context("marking the NodeClaim drifted")?;
        }
        Mode::NodeClaimDeleted => {
            snapdrain_testkit::karpenter::nodeclaims(client)
                .delete(&claim_of(&node)?, &DeleteParams::default())
                .await
                .context("deleting the NodeClaim")?;
        }
        Mode::SpotInterruption => {
            let action = snapdrain_sim::scenario::timeline::Action::SpotInterruption {
                node: node.clone(),
                notice: SPOT_NOTICE_MS,
            };
            b.cluster
                .act(&action)
                .map_err(|e| anyhow!("spot interruption notice for {node}: {e}"))?;
        }
        Mode::Consolidation => {}
    }
    Ok(Some(Episode {
        mode,
        node: Some(node),
        started: Instant::now(),
        first,
        closed: false,
        first_plan: None,
    }))
}

/// `GATE_SAMPLES` dry-run evictions of a held protected pod (429) and of an unprotected pod (201).
async fn gate_sample(
    b: &Bench,
    client: &Client,
    protected: &BTreeSet<String>,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let pods = items(b, &ResKey::core("pods"));
    let live: BTreeSet<String> = items(b, &ResKey::core("nodes"))
        .iter()
        .filter(|n| churn::open(n))
        .map(|n| name_of(n).to_string())
        .collect();
    let running = |p: &&Value| {
        str_at(p, "/status/phase") == Some("Running")
            && p.pointer("/metadata/deletionTimestamp").is_none()
            && str_at(p, "/spec/nodeName").is_some_and(|n| live.contains(n))
    };
    let key = |p: &Value| {
        format!(
            "{}/{}",
            str_at(p, "/metadata/namespace").unwrap_or_default(),
            name_of(p)
        )
    };
    // A held pod is one the gate refuses: a protected pod whose backup is not fresh (the gate lets one
    // through whose plan's verified backup it may reuse), so each candidate is asked once first.
    let protected_pods: Vec<String> = pods
        .iter()
        .filter(running)
        .filter(|p| protected.contains(&key(p)))
        .map(key)
        .collect();
    // The unprotected pods of the workloads' own namespaces (quickstart's `shop`, scale-5k's `tenant-*`):
    // not Velero's, which the gate may hold while a backup runs.
    let workload_namespaces: BTreeSet<&str> = protected
        .iter()
        .filter_map(|p| p.split_once('/').map(|(ns, _)| ns))
        .collect();
    let others: Vec<String> = pods
        .iter()
        .filter(running)
        .filter(|p| !super::sim::owned_by(p, "DaemonSet"))
        .filter(|p| {
            str_at(p, "/metadata/namespace").is_some_and(|ns| workload_namespaces.contains(ns))
        })
        .filter(|p| !protected.contains(&key(p)))
        .map(key)
        .collect();
    let mut out = (Vec::new(), Vec::new());
    for (candidates, want, into) in [
        (&protected_pods, 429, &mut out.0),
        (&others, 201, &mut out.1),
    ] {
        let mut pod = None;
        for c in candidates {
            let (ns, name) = c.split_once('/').unwrap_or_default();
            if evict_once(client, ns, name, want).await.is_ok() {
                pod = Some((ns, name));
                break;
            }
        }
        let (ns, name) = pod.ok_or_else(|| {
            anyhow!(
                "none of {} running pod(s) answered {want}: {candidates:?}",
                candidates.len()
            )
        })?;
        for _ in 0..GATE_SAMPLES {
            into.push(evict_once(client, ns, name, want).await?);
        }
    }
    Ok(out)
}
