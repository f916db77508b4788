//! One chaos run: the quickstart cluster, two controller replicas with leader election, and the plans
//! of a [`Schedule`] one after another, each meeting its faults from outside the controller (fault
//! rules through `/sim/faults`, replicas killed, a leader's Lease renewals refused). Once a plan's fault
//! window ends the rules are cleared and the plan must end; the judge reads the evidence at the end.
//!
//! The run reads the cluster's state straight from the simulator's store (never through the faulty
//! API), and waits on conditions with deadlines; the only sleeps are the schedule's own moments.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use serde_json::{Value, json};
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::scenario::format::NodeGroup;
use snapdrain_sim::world::autoscaler::{AutoscalerSettings, NODE_GROUP_LABEL};

use super::judge::{self, Evidence, Launched, Verdict};
use super::replicas::Replicas;
use super::rng::Rng;
use super::schedule::{Fault, Mode, Owner, schedule};
use crate::gate;
use crate::harness::{Harness, fast_timings, replacing_spec};

/// How a run is shaped.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub plans: usize,
    /// How long faults keep coming after a plan's disruption starts.
    pub window: Duration,
    /// How long a plan may take to end once its faults are over.
    pub settle: Duration,
    /// The replicas' Lease duration.
    pub lease_seconds: u64,
    /// The `snapdrain` binary: with it one of the two replicas is a `snapdrain controller` process,
    /// killed with SIGKILL when it leads at a kill's moment (the e2e test passes
    /// `env!("CARGO_BIN_EXE_snapdrain")`, the bench its own executable). Without it both run in-process.
    pub bin: Option<std::path::PathBuf>,
}

impl Options {
    /// The short form CI runs: every mode once, faults for three seconds each.
    pub fn short(seed: u64) -> Self {
        Self {
            seed,
            plans: super::schedule::MODES.len(),
            window: Duration::from_secs(3),
            settle: Duration::from_secs(90),
            lease_seconds: 3,
            bin: None,
        }
    }
}

/// What one run found.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub seed: u64,
    pub scheduled: usize,
    /// Plans the run could not start (no node left that fits), with why.
    pub skipped: Vec<String>,
    /// `mode node plan phase` per plan started.
    pub outcomes: Vec<String>,
    pub verdict: Verdict,
    /// For each plan that did not end: its message and the world's last events about its nodes.
    pub stuck: Vec<String>,
    /// Faults scheduled, by kind (a rule counts once, however often it fires).
    pub scheduled_faults: BTreeMap<String, u64>,
    /// Faults injected, by kind: what the simulator counted (each failed, delayed or cut request,
    /// each restart), plus kills and Lease losses.
    pub faults: BTreeMap<String, u64>,
    pub kills: u64,
    /// Of those, a `snapdrain controller` process's SIGKILL.
    pub process_kills: u64,
    /// The last log lines of each replica process, shown when the run is not clean.
    pub process_logs: Vec<(String, Vec<String>)>,
    /// The eviction gate's calls by how they ended (the simulator's record: `allowed`, `denied`,
    /// `failed-closed` when `failurePolicy: Fail` refused an eviction because the call failed).
    pub gate: BTreeMap<String, u64>,
    /// Evictions the API server admitted in namespaces the gate covers (the simulator's audit log): a
    /// gate in front of every one has allowed at least as many.
    pub evictions_admitted: u64,
    pub elapsed: Duration,
}

impl RunReport {
    /// 0 violations, 100% terminal plans, 0 duplicates, holds consistent.
    pub fn clean(&self) -> bool {
        self.verdict.clean() && self.verdict.holds_consistent()
    }

    /// Whether the gate stood in front of every eviction admitted where it applies: it allowed at least
    /// as many (an eviction it allowed may still meet a PodDisruptionBudget), and no failed call let
    /// one through (`failurePolicy: Fail`).
    pub fn gated(&self) -> bool {
        let n = |k: &str| self.gate.get(k).copied().unwrap_or(0);
        n("allowed") > 0 && n("allowed") >= self.evictions_admitted && n("failed-open") == 0
    }
}

impl std::fmt::Display for RunReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = &self.verdict;
        let by_kind = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        writeln!(
            f,
            "chaos seed={} plans={}/{} terminal={:.0}% completed={} violations={} (lost with node {}) let-go={} duplicates={} (backups {}, instances {}) holds lost={} orphaned={} kills={} (process SIGKILLs {}) gate (failurePolicy Fail): {} evictions-admitted={} faults injected: {} (scheduled: {}) ({:.1}s)",
            self.seed,
            v.plans,
            self.scheduled,
            v.terminal_percent(),
            v.completed,
            v.violations.len(),
            v.lost_with_node,
            v.let_go.len(),
            v.duplicate_backups.len() + v.duplicate_instances.len(),
            v.duplicate_backups.len(),
            v.duplicate_instances.len(),
            v.holds_lost.len(),
            v.holds_orphaned.len(),
            self.kills,
            self.process_kills,
            by_kind(&self.gate),
            self.evictions_admitted,
            by_kind(&self.faults),
            by_kind(&self.scheduled_faults),
            self.elapsed.as_secs_f64(),
        )?;
        let lists: [(&str, &[String]); 10] = [
            ("plan", &self.outcomes),
            ("skipped", &self.skipped),
            ("VIOLATION", &v.violations),
            ("let go", &v.let_go),
            ("NOT TERMINAL", &v.not_terminal),
            ("STUCK", &self.stuck),
            ("DUPLICATE BACKUP", &v.duplicate_backups),
            ("DUPLICATE INSTANCE", &v.duplicate_instances),
            ("HOLD LOST", &v.holds_lost),
            ("HOLD ORPHANED", &v.holds_orphaned),
        ];
        for (what, items) in lists {
            for i in items {
                writeln!(f, "  {what}: {i}")?;
            }
        }
        if !self.clean() || !self.gated() {
            for (identity, lines) in &self.process_logs {
                writeln!(f, "  last lines of replica process {identity}:")?;
                for l in lines {
                    writeln!(f, "    {l}")?;
                }
            }
        }
        Ok(())
    }
}

/// Timings that leave room for faults: a backup stays InProgress for most of a second.
fn chaos_timings() -> snapdrain_sim::world::Timings {
    snapdrain_sim::world::Timings {
        backup_overhead: Duration::from_millis(700),
        ..fast_timings()
    }
}

/// Runs the schedule for `opts.seed`.
pub async fn run(opts: &Options) -> RunReport {
    let started = Instant::now();
    let plan = schedule(opts.seed, opts.plans, opts.window.as_millis() as u64);
    // The quickstart grown to nine nodes (three per zone) and seven protected pods, so that after the
    // nodes earlier plans took, a later plan still finds a node whose pods have somewhere to go.
    let h = Harness::start_scenario_with("quickstart", chaos_timings(), |s| {
        s.nodes[0].count = Some(9);
        // Karpenter reads EC2's spot interruption warnings (its Helm chart's settings.interruptionQueue).
        s.karpenter.get_or_insert_default().interruption_queue = Some("chaos".into());
        for set in &mut s.stateful_sets {
            set.replicas += 1;
        }
        // EKS managed node groups Cluster Autoscaler manages, one node per zone. CA scales down what the
        // schedule asks (its own scans off: they would pick nodes outside the schedule); its eviction
        // retries and waits cut to seconds. The node in us-east-1a is twice the size of the others, so
        // the scheduler (the most free CPU among the nodes with the fewest pods of the same owner) puts
        // the first pod of each StatefulSet there, and the first CA plan finds protected pods to take.
        let ca_group =
            |name: Option<&str>, prefix: Option<&str>, zones: &[&str], size: &str| NodeGroup {
                name: name.map(str::to_string),
                prefix: prefix.map(str::to_string),
                count: Some(zones.len() as u32),
                zones: zones.iter().map(|z| z.to_string()).collect(),
                instance_type: size.into(),
                os_version: snapdrain_sim::scenario::format::default_os_version(),
                labels: BTreeMap::from([(NODE_GROUP_LABEL.to_string(), "workers".to_string())]),
                ..NodeGroup::default()
            };
        s.nodes.push(ca_group(
            Some("ca-workers-large"),
            None,
            &["us-east-1a"],
            "m6i.2xlarge",
        ));
        s.nodes.push(ca_group(
            None,
            Some("ca-workers"),
            &["us-east-1b", "us-east-1c"],
            "m6i.xlarge",
        ));
        s.cluster_autoscaler = Some(AutoscalerSettings {
            eviction_retry_time: Duration::from_secs(1),
            max_pod_eviction_time: Duration::from_secs(60),
            pod_eviction_headroom: Duration::from_secs(2),
            pod_gone_poll: Duration::from_millis(200),
            ..AutoscalerSettings::default()
        });
    })
    .await;
    let protected = crate::safety::protected_pods(&items(&h, &ResKey::core("pods"), None));
    // A short release window: a Release plan whose node Karpenter cannot take (its disruption budget
    // spent on NodeClaims whose failed plans keep their holds) ends within the run, holds restored.
    let policy: snapdrain::api::DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"}, "spec": {"releaseWindow": "20s"}
    }))
    .expect("a DisruptionPolicy");
    kube::Api::<snapdrain::api::DisruptionPolicy>::all(h.client.clone())
        .create(&kube::api::PostParams::default(), &policy)
        .await
        .expect("create the DisruptionPolicy");
    // The eviction gate under `failurePolicy: Fail`, served by every replica: every eviction (the
    // plans', Karpenter's, CA's) goes through it, and with the gate down none is admitted.
    crate::eviction::namespace(&h.client, gate::NS, json!({})).await;
    gate::configuration(&h.client, "Fail", None).await;
    let mut replicas = Replicas::start(&h, opts.lease_seconds, opts.bin.clone()).await;
    replicas.point_gate().await;
    gate_ready(&h).await;
    let mut outcomes = Vec::new();
    let mut skipped = Vec::new();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut picker = Rng::new(opts.seed ^ 0x5eed);
    for (i, episode) in plan.episodes.iter().enumerate() {
        // The promise covers pods snapdrain holds or gates: a disruption starts once the hold keeper
        // has held every protected pod (new ones included: rescheduled by earlier plans), as a
        // cluster running snapdrain is between disruptions.
        holds_at_rest(&h, &protected).await;
        let Some(node) = pick_node(&h, episode.mode, &mut picker) else {
            skipped.push(format!(
                "{}: no node runs protected pods beside an open node of its zone{}",
                episode.mode.as_str(),
                match episode.mode.owner() {
                    Owner::Any => "",
                    Owner::Karpenter => " and belongs to Karpenter",
                    Owner::NodeGroup => " and belongs to a node group of Cluster Autoscaler",
                }
            ));
            continue;
        };
        let name = format!("chaos-{}-{i}", opts.seed);
        let before: BTreeSet<String> = items(&h, &plans_key(), None)
            .iter()
            .map(|p| describe(p).0)
            .collect();
        if let Err(e) = disrupt(&h, episode.mode, &node, &name).await {
            skipped.push(format!("{} on {node}: {e}", episode.mode.as_str()));
            continue;
        }
        let t0 = tokio::time::Instant::now();
        for timed in &episode.faults {
            tokio::time::sleep_until(t0 + Duration::from_millis(timed.at_ms)).await;
            *counts.entry(timed.fault.kind()).or_default() += 1;
            inject(&h, &mut replicas, &timed.fault).await;
        }
        tokio::time::sleep_until(t0 + opts.window).await;
        h.cluster.faults.set(Vec::new());
        let outcome = match settle(&h, &node, &before, opts.settle).await {
            Some((made, phase)) => format!("{made} {phase}"),
            None => "no plan".into(),
        };
        outcomes.push(format!("{} {node} {outcome}", episode.mode.as_str()));
    }
    h.cluster.faults.set(Vec::new());
    // The faults are over: a plan still running (a signal's Release plan started after its episode
    // settled, say, when Karpenter's budget freed up) has the settle time to end, as each episode's had.
    all_terminal(&h, opts.settle).await;
    // Every plan is over: the holds must come to rest where they belong.
    let verdict = holds_at_rest(&h, &protected).await;
    let stuck = verdict
        .not_terminal
        .iter()
        .map(|p| why_stuck(&h, p.split(' ').next().unwrap_or_default()))
        .chain(
            verdict
                .holds_orphaned
                .iter()
                .filter_map(|o| why_held(&h, o)),
        )
        .collect();
    let (kills, process_kills) = (replicas.kills, replicas.process_kills);
    let process_logs = replicas.shutdown().await;
    let gate = h
        .cluster
        .api
        .state
        .admission
        .outcomes(gate::HOOK)
        .into_iter()
        .map(|(o, n)| (o.as_str().to_string(), n))
        .collect();
    let evictions_admitted = h
        .audit()
        .iter()
        .filter(|e| {
            e.source == "api"
                && e.verb == "create"
                && e.resource == "pods/eviction"
                && e.code.is_some_and(|c| (200..300).contains(&c))
                // The gate's namespaceSelector leaves out kube-system and its own namespace.
                && !matches!(e.namespace.as_deref(), Some("kube-system" | gate::NS))
        })
        .count() as u64;
    let mut faults = h.cluster.faults.injected();
    faults.insert("kill".into(), kills);
    if let Some(n) = counts.get("lease-loss") {
        faults.insert("lease-loss".into(), *n);
    }
    RunReport {
        seed: plan.seed,
        scheduled: plan.episodes.len(),
        skipped,
        outcomes,
        verdict,
        stuck,
        scheduled_faults: counts,
        faults,
        kills,
        process_kills,
        process_logs,
        gate,
        evictions_admitted,
        elapsed: started.elapsed(),
    }
}

/// Waits until the gate's configuration carries the CA that signs its certificate (the gate patches it
/// on its first pass): before that, under `failurePolicy: Fail`, every eviction would be refused.
async fn gate_ready(h: &Harness) {
    let key = ResKey::new(
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = h
            .cluster
            .store
            .get(&key, None, gate::CONFIGURATION)
            .and_then(|c| {
                c.pointer("/webhooks/0/clientConfig/caBundle")
                    .and_then(Value::as_str)
                    .map(|b| !b.is_empty())
            })
            .unwrap_or(false);
        if ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the gate did not patch its caBundle into {} within 30 s",
            gate::CONFIGURATION
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The objects of `key` as the store holds them now.
fn items(h: &Harness, key: &ResKey, ns: Option<&str>) -> Vec<Value> {
    h.cluster
        .store
        .list(key, ns, &|_| true, None, None)
        .items
        .iter()
        .map(|v| (**v).clone())
        .collect()
}

fn plans_key() -> ResKey {
    ResKey::new("snapdrain.io", "disruptionplans")
}

/// What a plan that did not end says, and what the simulated world last did about its nodes
/// (Karpenter's launches and disruptions, evictions, instance events).
fn why_stuck(h: &Harness, plan: &str) -> String {
    let Some(p) = items(h, &plans_key(), None)
        .into_iter()
        .find(|p| p.pointer("/metadata/name").and_then(Value::as_str) == Some(plan))
    else {
        return format!("{plan}: gone");
    };
    let nodes: Vec<String> = p
        .pointer("/spec/nodes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    // Their NodeClaims too: Karpenter's events name the claim.
    let claims: Vec<String> = items(h, &ResKey::core("nodes"), None)
        .iter()
        .filter(|n| {
            nodes
                .iter()
                .any(|x| n.pointer("/metadata/name").and_then(Value::as_str) == Some(x))
        })
        .flat_map(|n| {
            n.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|o| o["name"].as_str().map(str::to_string))
        .collect();
    let events: Vec<String> = h
        .audit()
        .iter()
        .filter(|e| e.source == "world")
        .filter(|e| {
            let text = serde_json::to_string(e).unwrap_or_default();
            nodes
                .iter()
                .chain(&claims)
                .any(|n| text.contains(n.as_str()))
        })
        .map(|e| {
            format!(
                "{} {} {} {}",
                e.verb,
                e.resource,
                e.name.as_deref().unwrap_or_default(),
                e.detail
            )
        })
        .collect();
    let relevant: Vec<&String> = events
        .iter()
        .filter(|e| !e.contains("node-agent"))
        .collect();
    let last = &relevant[relevant.len().saturating_sub(6)..];
    let marks = |v: &Value| {
        let a = v.pointer("/metadata/annotations");
        [
            "karpenter.sh/do-not-disrupt",
            "snapdrain.io/held",
            "snapdrain.io/released-by",
        ]
        .iter()
        .filter_map(|k| Some(format!("{k}={}", a?.get(*k)?.as_str()?)))
        .collect::<Vec<_>>()
        .join(",")
    };
    let held: Vec<String> = items(h, &ResKey::core("nodes"), None)
        .iter()
        .filter(|n| {
            nodes
                .iter()
                .any(|x| n.pointer("/metadata/name").and_then(Value::as_str) == Some(x))
        })
        .map(|n| format!("node [{}]", marks(n)))
        .chain(
            items(h, &ResKey::core("pods"), Some("shop"))
                .iter()
                .filter(|q| {
                    nodes
                        .iter()
                        .any(|x| q.pointer("/spec/nodeName").and_then(Value::as_str) == Some(x))
                })
                .map(|q| {
                    format!(
                        "{} [{}]",
                        q.pointer("/metadata/name")
                            .and_then(Value::as_str)
                            .unwrap_or_default(),
                        marks(q)
                    )
                }),
        )
        .collect();
    format!(
        "{plan}: {}; holds: {}; world: {}",
        p.pointer("/status/message")
            .and_then(Value::as_str)
            .unwrap_or("(no message)"),
        held.join(" "),
        last.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" | ")
    )
}

/// For an orphaned hold on a Velero pod (a PodVolumeBackup's hosting pod, named after it): the
/// PodVolumeBackup's phase, and what the world recorded about it and about Velero restarts.
fn why_held(h: &Harness, orphaned: &str) -> Option<String> {
    let pod = orphaned.strip_prefix("pod velero/")?.split(' ').next()?;
    let pvb = h.cluster.store.get(
        &ResKey::new("velero.io", "podvolumebackups"),
        Some("velero"),
        pod,
    );
    let phase = pvb
        .as_ref()
        .and_then(|p| p.pointer("/status/phase").and_then(Value::as_str))
        .unwrap_or("(none)")
        .to_string();
    let events: Vec<String> = h
        .audit()
        .iter()
        .filter(|e| {
            e.name.as_deref() == Some(pod)
                || (e.source == "world"
                    && e.verb == "restart"
                    && e.namespace.as_deref() == Some("velero"))
                || (e.source == "world" && e.verb == "stop" && e.resource == "deployments.apps")
        })
        .map(|e| {
            format!(
                "{} {} {} {} {}",
                e.time, e.source, e.verb, e.resource, e.detail
            )
        })
        .collect();
    Some(format!(
        "held Velero pod {pod}: its PodVolumeBackup is {phase}; {}",
        events.join(" | ")
    ))
}

/// Waits until every plan is terminal, or `limit` passes (the judge then names the ones that are not).
async fn all_terminal(h: &Harness, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let running = items(h, &plans_key(), None).iter().any(|p| {
            !matches!(
                p.pointer("/status/phase").and_then(Value::as_str),
                Some("Completed" | "Failed" | "Aborted")
            )
        });
        if !running {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (up to 30 s) until the holds are where they belong, and returns the verdict then.
async fn holds_at_rest(h: &Harness, protected: &BTreeMap<String, BTreeSet<String>>) -> Verdict {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = judge_now(h, protected);
        if v.holds_consistent() || Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn judge_now(h: &Harness, protected: &BTreeMap<String, BTreeSet<String>>) -> Verdict {
    let audit = h.audit();
    let plans = items(h, &plans_key(), None);
    let backups = items(h, &ResKey::new("velero.io", "backups"), Some("velero"));
    let pods = items(h, &ResKey::core("pods"), None);
    let nodes = items(h, &ResKey::core("nodes"), None);
    let instances = Launched::all_of(&h.cluster);
    let pvs = items(h, &ResKey::core("persistentvolumes"), None);
    let snapshots = crate::safety::Ec2Snapshot::all_of(&h.cluster);
    judge::judge(&Evidence {
        audit: &audit,
        protected,
        plans: &plans,
        backups: &backups,
        instances: &instances,
        pods: &pods,
        nodes: &nodes,
        pvs: &pvs,
        snapshots: &snapshots,
        csi_cuts: &crate::safety::csi_cuts_of(&h.cluster),
    })
}

/// A node that runs protected pods (by the oracle's rule) and shares its zone with another open node
/// (the pods' volumes are zonal: the last node of a zone would leave them Pending for good); a
/// Karpenter node when the mode's signal comes from its NodeClaim, one of CA's node groups for CA.
fn pick_node(h: &Harness, mode: Mode, rng: &mut Rng) -> Option<String> {
    const ZONE: &str = "topology.kubernetes.io/zone";
    let nodes = items(h, &ResKey::core("nodes"), None);
    let pods = items(h, &ResKey::core("pods"), None);
    let open = |n: &Value| {
        let ready = n
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        ready
            && n.pointer("/spec/unschedulable") != Some(&json!(true))
            && n.pointer("/metadata/deletionTimestamp").is_none()
            && n.pointer("/spec/taints")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
    };
    let zone = |n: &Value| {
        n.pointer("/metadata/labels")
            .and_then(|l| l.get(ZONE))
            .cloned()
    };
    let protected = crate::safety::protected_pods(&pods);
    let on_node = |node: &str| {
        pods.iter().any(|p| {
            p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node)
                && p.pointer("/metadata/deletionTimestamp").is_none()
                && protected.contains_key(&format!(
                    "{}/{}",
                    p.pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                    p.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                ))
        })
    };
    let ca_managed = |n: &Value| {
        n.pointer("/metadata/labels")
            .and_then(|l| l.get(NODE_GROUP_LABEL))
            .is_some()
    };
    let owned = |n: &Value| match mode.owner() {
        // CA's nodes are left to CA's mode, which has only those three.
        Owner::Any => !ca_managed(n),
        Owner::Karpenter => n
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|o| o.iter().any(|r| r["kind"] == "NodeClaim")),
        Owner::NodeGroup => ca_managed(n),
    };
    let busy: BTreeSet<String> = items(h, &plans_key(), None)
        .iter()
        .filter(|p| {
            !matches!(
                p.pointer("/status/phase").and_then(Value::as_str),
                Some("Completed" | "Failed" | "Aborted")
            )
        })
        .flat_map(|p| {
            p.pointer("/spec/nodes")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    let mut candidates: Vec<String> = nodes
        .iter()
        .filter(|n| open(n) && owned(n))
        .filter_map(|n| {
            let name = n.pointer("/metadata/name")?.as_str()?;
            let sibling = nodes.iter().any(|m| {
                m.pointer("/metadata/name").and_then(Value::as_str) != Some(name)
                    && open(m)
                    && zone(m) == zone(n)
            });
            (sibling && on_node(name) && !busy.contains(name)).then(|| name.to_string())
        })
        .collect();
    candidates.sort();
    (!candidates.is_empty()).then(|| rng.pick(&candidates).clone())
}

/// The spot interruption notice, shorter than EC2's two minutes: long enough for a backup under the
/// faults of a plan's window, short enough that the instance of a plan that failed (its holds kept,
/// Karpenter's termination waiting on them and its disruption budget spent on that NodeClaim) is
/// reclaimed within the run, as EC2 does whatever was drained, and later Release plans can proceed.
/// The pods EC2 takes leave through the pod garbage collector, not through an eviction or DELETE: the
/// judge counts a protected one a loss with its node unless a backup taken while it ran there covers it
/// or the plan's failure let it go.
const SPOT_NOTICE_MS: u64 = 30_000;

/// Starts the disruption of `node` the way `mode` says.
async fn disrupt(h: &Harness, mode: Mode, node: &str, name: &str) -> Result<(), String> {
    match mode {
        Mode::ExecuteReplace => {
            h.create_plan(name, replacing_spec(node)).await;
        }
        Mode::Execute => {
            h.create_plan(name, json!({"nodes": [node]})).await;
        }
        Mode::Manual => {
            let mut spec = replacing_spec(node);
            spec["source"] = json!("manual");
            spec["replacement"]["when"] = json!("before-drain");
            h.create_plan(name, spec).await;
        }
        Mode::Drift => {
            let claim = h.nodeclaim_of(node).await;
            crate::karpenter::mark_drifted(&h.client, &claim)
                .await
                .map_err(|e| format!("marking NodeClaim {claim} drifted: {e}"))?;
        }
        Mode::SpotInterruption => {
            // A plan that cannot make the deadline fails loudly, which is terminal too.
            let action = snapdrain_sim::scenario::timeline::Action::SpotInterruption {
                node: node.to_string(),
                notice: SPOT_NOTICE_MS,
            };
            h.cluster
                .act(&action)
                .map_err(|e| format!("spot interruption notice for {node}: {e}"))?;
        }
        Mode::ClusterAutoscaler => {
            let ca = h
                .cluster
                .autoscaler
                .as_ref()
                .ok_or("the simulated cluster runs no Cluster Autoscaler")?;
            if !ca.scale_down(node) {
                return Err("the simulated Cluster Autoscaler has stopped".into());
            }
        }
        Mode::NodeClaimDeleted => {
            let claim = h.nodeclaim_of(node).await;
            crate::karpenter::nodeclaims(&h.client)
                .delete(&claim, &DeleteParams::default())
                .await
                .map_err(|e| format!("deleting NodeClaim {claim}: {e}"))?;
        }
    }
    Ok(())
}

/// Applies one fault.
async fn inject(h: &Harness, replicas: &mut Replicas<'_>, fault: &Fault) {
    match fault {
        Fault::Rule(rule) => post_rule(h, rule).await,
        Fault::KillLeader => replicas.kill_leader().await,
        Fault::LeaseLoss { ms } => {
            if let Some(identity) = replicas.leader() {
                // kube-lease-manager patches its Lease as `kube-lease-manager-<identity>`.
                post_rule(
                    h,
                    &json!({"verb": "patch", "resource": "leases.coordination.k8s.io",
                        "fieldManager": format!("kube-lease-manager-{identity}"),
                        "errorRate": 1.0, "errorCode": 503, "durationMs": ms}),
                )
                .await;
            }
        }
    }
}

/// Adds a rule through the simulator's control surface, as an operator would.
async fn post_rule(h: &Harness, rule: &Value) {
    let url = format!("{}/sim/faults", h.cluster.url());
    let answer = crate::raw_client(h.cluster.ca_pem())
        .post(&url)
        .json(rule)
        .send()
        .await;
    match answer {
        Ok(r) if r.status().is_success() => {}
        Ok(r) => panic!(
            "the simulator refused fault rule {rule}: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        ),
        Err(e) => panic!("posting fault rule {rule}: {e}"),
    }
}

/// Waits until a plan for `node` made since `before` exists and is terminal, or `limit` passes;
/// returns its name and last phase.
async fn settle(
    h: &Harness,
    node: &str,
    before: &BTreeSet<String>,
    limit: Duration,
) -> Option<(String, String)> {
    let deadline = Instant::now() + limit;
    loop {
        let plan = items(h, &plans_key(), None)
            .iter()
            .filter(|p| {
                p.pointer("/spec/nodes")
                    .and_then(Value::as_array)
                    .is_some_and(|ns| ns.iter().any(|n| n == node))
            })
            .map(describe)
            .find(|(name, _)| !before.contains(name));
        let done = plan.as_ref().is_some_and(|(_, phase)| {
            ["Completed", "Failed", "Aborted"]
                .iter()
                .any(|t| phase.starts_with(t))
        });
        if done || Instant::now() >= deadline {
            return plan;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A plan's name and phase (with its message when it failed).
fn describe(p: &Value) -> (String, String) {
    let phase = p
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending");
    let message = p
        .pointer("/status/message")
        .and_then(Value::as_str)
        .filter(|_| phase == "Failed")
        .map(|m| format!(": {m}"))
        .unwrap_or_default();
    (
        p.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        format!("{phase}{message}"),
    )
}
