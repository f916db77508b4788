//! The simulated Cluster Autoscaler and aws-node-termination-handler draining nodes of a scenario through
//! the Eviction API, with an eviction gate (a validating webhook answering 429 until told to allow, as
//! snapdrain's gate does while a backup is pending) in front of the `shop` namespace.
//!
//! The behaviour checked comes from the upstream sources named in `world::autoscaler` and `world::nth`:
//! kubernetes/autoscaler `cluster-autoscaler/core/scaledown/actuation/drain.go` (retry every
//! EvictionRetryTime until MaxPodEvictionTime), `actuator.go` (taint removed on a failed drain),
//! `utils/taints/taints.go` (the ToBeDeleted taint), `simulator/drainability/rules/notsafetoevict/rule.go`
//! (safe-to-evict=false blocks the node); aws/aws-node-termination-handler `pkg/node/node.go` (the spot-itn
//! taint, the drain helper), `pkg/config/config.go` (flag defaults), `pkg/monitor/spotitn/` (event IDs).

use std::error::Error;
use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client};
use serde_json::{Value, json};
use snapdrain_sim::apiserver::admission::ADDRESS_ANNOTATION;
use snapdrain_sim::apiserver::audit::AuditEntry;
use snapdrain_sim::ec2::InstanceState;
use snapdrain_sim::world::Timings;
use snapdrain_sim::world::nth::Notice;
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};
use snapdrain_testkit::webhook::{BACKUP_MESSAGE, Gate, HOOK, pki, serve};
use snapdrain_testkit::{capture_logs, eventually};

type TestResult = Result<(), Box<dyn Error>>;

const CA: &str = "cluster-autoscaler";
const NTH: &str = "aws-node-termination-handler";

/// Three nodes outside Karpenter, each an EC2 instance; CA's intervals cut from seconds to milliseconds.
const BASE: &str = r#"
name: drainers
nodes:
  - {name: ng-a, zone: us-east-1a, instanceType: m5.large}
  - {name: ng-b, zone: us-east-1a, instanceType: m5.large}
  - {name: ng-c, zone: us-east-1b, instanceType: m5.large}
"#;

struct Env {
    sim: SimCluster,
    client: Client,
    gate: Gate,
}

/// `(namespace, name, node, annotations)`.
type PodSpec<'a> = (&'a str, &'a str, &'a str, Value);

fn pod(ns: &str, name: &str, node: &str, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}, "annotations": annotations},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "postgres:17"}]}})
}

/// The gate's Service and ValidatingWebhookConfiguration as manifests, so that they are in place before
/// the world (and the timeline) starts.
fn gate_objects(addr: std::net::SocketAddr, ca_pem: &str) -> Vec<Value> {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "snapdrain"}}),
        json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "shop", "labels": {"snapdrain.io/gate": "on"}}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "gate", "namespace": "snapdrain", "annotations": {ADDRESS_ANNOTATION: addr.to_string()}},
            "spec": {"ports": [{"port": 443, "targetPort": 8443}]}}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "snapdrain-gate"},
            "webhooks": [{"name": HOOK,
                "clientConfig": {"service": {"namespace": "snapdrain", "name": "gate", "path": "/validate"}, "caBundle": ca},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                    "resources": ["pods/eviction"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"snapdrain.io/gate": "on"}},
                "failurePolicy": "Fail", "sideEffects": "NoneOnDryRun",
                "admissionReviewVersions": ["v1"], "timeoutSeconds": 5}]}),
    ]
}

impl Env {
    /// The base scenario plus `extra` YAML (drainer settings, a timeline), the gate (denying while
    /// `deny`), and `pods` bound to their nodes from the start.
    async fn start(extra: &str, deny: bool, pods: &[PodSpec<'_>]) -> Result<Self, Box<dyn Error>> {
        capture_logs();
        let gate = Gate::default();
        gate.deny.store(deny, Ordering::SeqCst);
        let certs = pki(&["gate.snapdrain.svc"]);
        let addr = serve(gate.clone(), &certs).await;
        let mut scenario = snapdrain_sim::scenario::parse(&format!("{BASE}{extra}"), "drainers")?;
        scenario.objects.extend(gate_objects(addr, &certs.ca_pem));
        scenario.objects.extend(
            pods.iter()
                .map(|(ns, n, node, a)| pod(ns, n, node, a.clone())),
        );
        let sim = SimCluster::start(SimConfig {
            scenario: Some(ScenarioSource::Inline {
                scenario: Box::new(scenario),
                label: "drainers".into(),
            }),
            timings: Some(Timings {
                pod_start: Duration::from_millis(20),
                pod_stop: Duration::from_millis(20),
                volume_detach: Duration::from_millis(20),
                ..Timings::instant()
            }),
            ..Default::default()
        })
        .await?;
        let mut config = sim.kube_config();
        config.default_retry = false;
        let client = Client::try_from(config)?;
        Ok(Self { sim, client, gate })
    }

    /// World events of `verb` about `name`, in order.
    fn world(&self, verb: &str, name: &str) -> Vec<AuditEntry> {
        self.sim
            .audit
            .since(0)
            .into_iter()
            .filter(|e| e.source == "world" && e.verb == verb && e.name.as_deref() == Some(name))
            .collect()
    }

    async fn await_world(&self, verb: &str, name: &str) -> AuditEntry {
        eventually(&format!("{verb} for {name}"), || async {
            self.world(verb, name).into_iter().next()
        })
        .await
    }

    /// Eviction attempts `by` a drainer on pod `name`, as `(code, message)`.
    fn attempts(&self, name: &str, by: &str) -> Vec<(u64, String)> {
        self.world("eviction-attempt", name)
            .into_iter()
            .filter(|e| e.detail["by"] == by)
            .map(|e| {
                (
                    e.detail["code"].as_u64().unwrap_or(0),
                    e.detail["message"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    async fn node(&self, name: &str) -> Result<Option<Node>, kube::Error> {
        Api::<Node>::all(self.client.clone()).get_opt(name).await
    }

    async fn pod(&self, ns: &str, name: &str) -> Result<Option<Pod>, kube::Error> {
        Api::<Pod>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
    }

    async fn running(&self, pods: &[(&str, &str)]) {
        eventually("the pods to run", || async {
            for (ns, name) in pods {
                let p = self.pod(ns, name).await.ok()??;
                (p.status?.phase.as_deref() == Some("Running")).then_some(())?;
            }
            Some(())
        })
        .await;
    }

    fn instance_state(&self, node: &str) -> Option<InstanceState> {
        let id = &self
            .sim
            .scenario
            .as_ref()?
            .instances
            .iter()
            .find(|i| i.node_name == node)?
            .instance_id;
        Some(self.sim.ec2.as_ref()?.instance(id)?.state)
    }

    fn autoscaler(
        &self,
    ) -> Result<&snapdrain_sim::world::autoscaler::AutoscalerHandle, &'static str> {
        self.sim
            .autoscaler
            .as_ref()
            .ok_or("the world runs Cluster Autoscaler")
    }
}

fn taint<'a>(node: &'a Node, key: &str) -> Option<&'a k8s_openapi::api::core::v1::Taint> {
    node.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == key)
}

fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

const CA_FAST: &str = "clusterAutoscaler: {evictionRetryTime: 100, maxPodEvictionTime: 20000, podEvictionHeadroom: 2000, podGonePoll: 100}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn autoscaler_skips_a_node_with_a_safe_to_evict_false_pod() -> TestResult {
    // Upstream: cluster-autoscaler/simulator/drainability/rules/notsafetoevict/rule.go.
    let timeline = "timeline:\n  - {at: 500, action: {autoscalerScaleDown: {nodes: [ng-a]}}}\n";
    let env = Env::start(
        &format!("{CA_FAST}{timeline}"),
        false,
        &[
            (
                "shop",
                "db-0",
                "ng-a",
                json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}),
            ),
            ("default", "web-0", "ng-a", json!({})),
        ],
    )
    .await?;
    let skipped = env.await_world("scale-down-skipped", "ng-a").await;
    assert_eq!(skipped.detail["reason"], "NotSafeToEvictAnnotation");
    assert_eq!(skipped.detail["pod"], "shop/db-0");
    let node = env.node("ng-a").await?.ok_or("ng-a stays")?;
    assert!(taint(&node, "ToBeDeletedByClusterAutoscaler").is_none());
    assert!(!unschedulable(&node));
    assert!(env.attempts("web-0", CA).is_empty(), "nothing evicted");
    assert!(env.attempts("db-0", CA).is_empty(), "nothing evicted");
    assert_eq!(env.instance_state("ng-a"), Some(InstanceState::Running));

    // A node annotated scale-down-disabled is skipped too
    // (cluster-autoscaler/core/scaledown/eligibility/eligibility.go).
    Api::<Node>::all(env.client.clone())
        .patch(
            "ng-b",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations":
                {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}}})),
        )
        .await?;
    assert!(env.autoscaler()?.scale_down("ng-b"));
    let skipped = env.await_world("scale-down-skipped", "ng-b").await;
    assert_eq!(skipped.detail["reason"], "ScaleDownDisabledAnnotation");
    assert!(env.world("scale-down-tainted", "ng-b").is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn autoscaler_taints_drains_and_deletes_a_node() -> TestResult {
    // Upstream: cluster-autoscaler/core/scaledown/actuation/actuator.go, drain.go; utils/taints/taints.go.
    let env = Env::start(
        CA_FAST,
        false,
        &[
            ("default", "web-0", "ng-b", json!({})),
            ("shop", "db-0", "ng-b", json!({})),
            // A static pod's mirror: CA never evicts it (drain.go podsToEvict).
            (
                "kube-system",
                "kube-proxy-ng-b",
                "ng-b",
                json!({"kubernetes.io/config.mirror": "2b4b6fbf"}),
            ),
        ],
    )
    .await?;
    env.running(&[("default", "web-0"), ("shop", "db-0")]).await;
    let before = jiff::Timestamp::now().as_second();
    assert!(env.autoscaler()?.scale_down("ng-b"));
    let deleted = env.await_world("scale-down-deleted", "ng-b").await;
    let tainted = env
        .world("scale-down-tainted", "ng-b")
        .into_iter()
        .next()
        .ok_or("tainted first")?;
    // The taint's value is the Unix time CA marked the node.
    let value: i64 = tainted.detail["value"].as_str().ok_or("a value")?.parse()?;
    assert!((before..before + 5).contains(&value), "{value} vs {before}");
    assert_eq!(tainted.detail["effect"], "NoSchedule");
    for pod in ["web-0", "db-0"] {
        let attempts = env.attempts(pod, CA);
        assert_eq!(attempts.len(), 1, "{pod}: {attempts:?}");
        assert_eq!(attempts[0].0, 201);
        let evicted = env.world("eviction-attempt", pod);
        assert!(tainted.seq < evicted[0].seq, "tainted before the evictions");
    }
    // The evictions went through the API as CA's (its user agent), and the webhook saw who sent them.
    let api: Vec<AuditEntry> = env
        .sim
        .audit
        .since(0)
        .into_iter()
        .filter(|e| e.source == "api" && e.resource.contains("eviction"))
        .collect();
    assert!(
        api.iter()
            .all(|e| e.user_agent.as_deref().is_some_and(|u| u.starts_with(CA))),
        "{api:?}"
    );
    let review = env
        .gate
        .reviews()
        .into_iter()
        .next()
        .ok_or("db-0 was reviewed")?;
    assert_eq!(review["request"]["userInfo"]["username"], "snapdrain-sim");
    assert_eq!(
        review["request"]["object"]["deleteOptions"]["gracePeriodSeconds"],
        5
    );
    assert!(
        deleted.detail["instance"]
            .as_str()
            .is_some_and(|i| i.starts_with("i-"))
    );
    eventually("ng-b's Node to go", || async {
        matches!(env.node("ng-b").await, Ok(None)).then_some(())
    })
    .await;
    assert_eq!(env.instance_state("ng-b"), Some(InstanceState::Terminated));
    assert!(env.node("ng-a").await?.is_some(), "the other nodes stay");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn autoscaler_retries_a_refused_eviction_until_the_gate_allows() -> TestResult {
    // Upstream: cluster-autoscaler/core/scaledown/actuation/drain.go (evictPod retries every
    // EvictionRetryTime until MaxPodEvictionTime, whatever the error).
    let env = Env::start(CA_FAST, true, &[("shop", "db-0", "ng-a", json!({}))]).await?;
    env.running(&[("shop", "db-0")]).await;
    assert!(env.autoscaler()?.scale_down("ng-a"));
    eventually("CA to retry the refused eviction", || async {
        (env.attempts("db-0", CA).len() >= 3).then_some(())
    })
    .await;
    let attempts = env.attempts("db-0", CA);
    assert_eq!(attempts[0].0, 429);
    assert_eq!(
        attempts[0].1,
        format!("admission webhook \"{HOOK}\" denied the request: {BACKUP_MESSAGE}")
    );
    let node = env.node("ng-a").await?.ok_or("ng-a is there")?;
    assert!(taint(&node, "ToBeDeletedByClusterAutoscaler").is_some());
    assert!(env.pod("shop", "db-0").await?.is_some());
    assert!(env.world("scale-down-deleted", "ng-a").is_empty());

    env.gate.deny.store(false, Ordering::SeqCst);
    env.await_world("scale-down-deleted", "ng-a").await;
    let attempts = env.attempts("db-0", CA);
    assert_eq!(attempts.last().map(|a| a.0), Some(201), "{attempts:?}");
    assert!(env.world("scale-down-failed", "ng-a").is_empty());
    eventually("ng-a's Node to go", || async {
        matches!(env.node("ng-a").await, Ok(None)).then_some(())
    })
    .await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn autoscaler_gives_up_after_max_pod_eviction_time_and_untaints() -> TestResult {
    // Upstream: cluster-autoscaler/core/scaledown/actuation/drain.go (retryUntil), actuator.go
    // (CleanUpAndRecordFailedScaleDownEvent removes the ToBeDeleted taint; the node stays).
    let settings =
        "clusterAutoscaler: {evictionRetryTime: 100, maxPodEvictionTime: 1000, podGonePoll: 100}\n";
    let env = Env::start(
        settings,
        true,
        &[
            ("shop", "db-0", "ng-c", json!({})),
            ("default", "web-0", "ng-c", json!({})),
        ],
    )
    .await?;
    env.running(&[("shop", "db-0"), ("default", "web-0")]).await;
    assert!(env.autoscaler()?.scale_down("ng-c"));
    let failed = env.await_world("scale-down-failed", "ng-c").await;
    let error = failed.detail["error"].as_str().unwrap_or("");
    assert!(
        error.contains("failed to evict pod shop/db-0 within allowed timeout"),
        "{error}"
    );
    assert_eq!(failed.detail["untainted"], true);
    let refused = env.attempts("db-0", CA);
    // One attempt, then one every 100 ms for a second.
    assert!(refused.len() >= 5, "{refused:?}");
    assert!(refused.iter().all(|(code, _)| *code == 429));
    let node = env.node("ng-c").await?.ok_or("ng-c stays")?;
    assert!(taint(&node, "ToBeDeletedByClusterAutoscaler").is_none());
    assert!(!unschedulable(&node));
    let db = env.pod("shop", "db-0").await?.ok_or("db-0 stays")?;
    assert!(db.metadata.deletion_timestamp.is_none());
    assert_eq!(env.instance_state("ng-c"), Some(InstanceState::Running));
    assert!(env.world("scale-down-deleted", "ng-c").is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nth_taints_drains_and_the_node_goes_at_the_spot_deadline_despite_a_refused_eviction()
-> TestResult {
    // Upstream: aws-node-termination-handler pkg/node/node.go (TaintSpotItn, the drain helper: Force,
    // Timeout = node-termination-grace-period), pkg/monitor/spotitn/spot-itn-monitor.go (event ID),
    // kubectl pkg/drain/drain.go (429 retried, EvictErrorRetryDelay unset by NTH).
    let extra = "nodeTerminationHandler: {taintNode: true, deletePoll: 100}\n\
        timeline:\n  - {at: 300, action: {spotInterruption: {node: ng-c, notice: 4000}}}\n";
    let env = Env::start(
        extra,
        true,
        &[
            ("shop", "db-0", "ng-c", json!({})),
            ("default", "web-0", "ng-c", json!({})),
            ("default", "api-0", "ng-a", json!({})),
        ],
    )
    .await?;
    let tainted = env.await_world("nth-tainted", "ng-c").await;
    let value = tainted.detail["value"].as_str().unwrap_or("");
    assert!(
        value.starts_with("spot-itn-") && value.len() == 63,
        "{value}"
    );
    let node = env.node("ng-c").await?.ok_or("ng-c until the deadline")?;
    let t = taint(&node, "aws-node-termination-handler/spot-itn").ok_or("the spot-itn taint")?;
    assert_eq!(t.value.as_deref(), Some(value));
    assert_eq!(t.effect, "NoSchedule");
    eventually("ng-c cordoned", || async {
        env.node("ng-c")
            .await
            .ok()?
            .filter(unschedulable)
            .map(|_| ())
    })
    .await;
    eventually("web-0 evicted", || async {
        env.attempts("web-0", NTH)
            .iter()
            .any(|(code, _)| *code == 201)
            .then_some(())
    })
    .await;
    // The refused eviction is retried at once, again and again.
    eventually("NTH to retry db-0", || async {
        (env.gate.reviews().len() >= 3).then_some(())
    })
    .await;
    assert_eq!(env.attempts("db-0", NTH).first().map(|a| a.0), Some(429));

    let reclaimed = eventually("the instance reclaimed", || async {
        env.sim
            .audit
            .since(0)
            .into_iter()
            .find(|e| e.verb == "spot-instance-reclaimed")
    })
    .await;
    assert_eq!(reclaimed.detail["node"], "ng-c");
    assert!(reclaimed.detail.get("error").is_none(), "{reclaimed:?}");
    eventually("ng-c and db-0 gone with the instance", || async {
        let node = env.node("ng-c").await.ok()?;
        let db = env.pod("shop", "db-0").await.ok()?;
        (node.is_none() && db.is_none()).then_some(())
    })
    .await;
    assert_eq!(env.instance_state("ng-c"), Some(InstanceState::Terminated));
    assert!(
        env.world("nth-drained", "ng-c").is_empty(),
        "the drain never finished"
    );
    assert!(
        env.pod("default", "api-0").await?.is_some(),
        "other nodes untouched"
    );
    let action = env
        .sim
        .audit
        .since(0)
        .into_iter()
        .find(|e| e.verb == "spotInterruption")
        .ok_or("the timeline ran")?;
    assert_eq!(action.detail["result"]["nodeTerminationHandler"], true);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nth_only_cordons_on_a_rebalance_recommendation_by_default() -> TestResult {
    // Upstream: aws-node-termination-handler pkg/interruptionevent/draincordon/handler.go (cordon only
    // without --enable-rebalance-draining), pkg/node/node.go (TaintRebalanceRecommendation).
    let env = Env::start(
        "nodeTerminationHandler: {taintNode: true}\n",
        false,
        &[("default", "web-0", "ng-b", json!({}))],
    )
    .await?;
    env.running(&[("default", "web-0")]).await;
    let nth = env.sim.nth.as_ref().ok_or("the scenario installs NTH")?;
    assert!(nth.notify(
        "ng-b",
        Notice::RebalanceRecommendation {
            noticed: jiff::Timestamp::now()
        }
    ));
    env.await_world("nth-cordoned", "ng-b").await;
    let node = env.node("ng-b").await?.ok_or("ng-b stays")?;
    let t = taint(
        &node,
        "aws-node-termination-handler/rebalance-recommendation",
    )
    .ok_or("the rebalance taint")?;
    assert!(
        t.value
            .as_deref()
            .is_some_and(|v| v.starts_with("rebalance-recommendation-"))
    );
    assert!(unschedulable(&node));
    assert!(env.attempts("web-0", NTH).is_empty());
    assert_eq!(env.instance_state("ng-b"), Some(InstanceState::Running));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn autoscaler_scales_down_a_count_of_nodes_one_drain_at_a_time() -> TestResult {
    // Upstream: cluster-autoscaler/core/scaledown/actuation/actuator.go (cropNodesToBudgets:
    // --max-drain-parallelism, 1 by default; nodes beyond the budget are not tainted).
    let timeline = "timeline:\n  - {at: 500, action: {autoscalerScaleDown: {count: 2}}}\n";
    let env = Env::start(
        &format!("{CA_FAST}{timeline}"),
        false,
        &[
            ("default", "web-0", "ng-a", json!({})),
            ("default", "web-1", "ng-b", json!({})),
            ("default", "web-2", "ng-c", json!({})),
        ],
    )
    .await?;
    let first = env.await_world("scale-down-deleted", "ng-a").await;
    let second = env.await_world("scale-down-deleted", "ng-b").await;
    let tainted_b = env
        .world("scale-down-tainted", "ng-b")
        .into_iter()
        .next()
        .ok_or("ng-b tainted")?;
    assert!(
        first.seq < tainted_b.seq && tainted_b.seq < second.seq,
        "ng-b waits for ng-a's drain"
    );
    let action = env
        .sim
        .audit
        .since(0)
        .into_iter()
        .find(|e| e.verb == "autoscalerScaleDown")
        .ok_or("the timeline ran")?;
    assert_eq!(
        action.detail["result"]["requested"],
        json!(["ng-a", "ng-b"])
    );
    assert!(env.world("scale-down-tainted", "ng-c").is_empty());
    assert!(env.pod("default", "web-2").await?.is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nth_default_install_cordons_and_drains_without_a_taint() -> TestResult {
    // Upstream: aws-node-termination-handler pkg/config/config.go (--taint-node defaults to false),
    // pkg/node/node.go (CordonAndDrain).
    let env = Env::start(
        "nodeTerminationHandler: {deletePoll: 100}\n",
        false,
        &[
            ("default", "web-0", "ng-a", json!({})),
            ("shop", "db-0", "ng-a", json!({})),
        ],
    )
    .await?;
    env.running(&[("default", "web-0"), ("shop", "db-0")]).await;
    let nth = env.sim.nth.as_ref().ok_or("the scenario installs NTH")?;
    let deadline = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(60);
    assert!(nth.notify("ng-a", Notice::SpotInterruption { deadline }));
    let drained = env.await_world("nth-drained", "ng-a").await;
    assert_eq!(drained.detail["pods"], 2);
    for pod in ["web-0", "db-0"] {
        assert_eq!(env.attempts(pod, NTH).first().map(|a| a.0), Some(201));
    }
    for (ns, pod) in [("default", "web-0"), ("shop", "db-0")] {
        assert!(env.pod(ns, pod).await?.is_none(), "{pod} gone");
    }
    let node = env
        .node("ng-a")
        .await?
        .ok_or("ng-a stays until EC2 reclaims it")?;
    assert!(unschedulable(&node));
    assert!(
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_none_or(|ts| ts.iter().all(|t| !t.key.starts_with(NTH))),
        "no NTH taint without --taint-node"
    );
    assert!(env.world("nth-tainted", "ng-a").is_empty());
    Ok(())
}

/// Labels `node` as a node of an EKS managed node group, which the simulated CA manages.
async fn join_node_group(env: &Env, node: &str) -> TestResult {
    Api::<Node>::all(env.client.clone())
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels":
                {snapdrain_sim::world::autoscaler::NODE_GROUP_LABEL: "workers"}}})),
        )
        .await?;
    Ok(())
}

fn time_of(e: &AuditEntry) -> Result<jiff::Timestamp, Box<dyn Error>> {
    Ok(e.time.parse()?)
}

const CA_SCANS: &str = "clusterAutoscaler: {scaleDownEnabled: true, scanInterval: 100, \
    scaleDownUnneededTime: 1000, scaleDownDelayAfterFailure: 500, evictionRetryTime: 100, \
    maxPodEvictionTime: 1000, podEvictionHeadroom: 2000, podGonePoll: 100}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn autoscaler_finds_an_unneeded_node_itself_gives_up_at_the_gate_and_comes_back() -> TestResult
{
    // Upstream: cluster-autoscaler/core/scaledown/eligibility/eligibility.go (utilisation below
    // --scale-down-utilization-threshold), core/scaledown/unneeded/nodes.go (RemovableAt after
    // --scale-down-unneeded-time), core/scaledown/actuation/softtaint.go (DeletionCandidate soft taint),
    // simulator/drainability/rules (safe-to-evict "false" blocks, "true" lets a bare pod move),
    // actuation/drain.go (retries until --max-pod-eviction-time), actuator.go (taint removed on failure),
    // core/static_autoscaler.go (--scale-down-delay-after-failure).
    let env = Env::start(
        CA_SCANS,
        true,
        &[
            (
                "shop",
                "db-0",
                "ng-a",
                json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}),
            ),
            (
                "shop",
                "db-1",
                "ng-b",
                json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}),
            ),
        ],
    )
    .await?;
    env.running(&[("shop", "db-0"), ("shop", "db-1")]).await;
    // CA finds ng-a unneeded no earlier than it joins the node group.
    let joined = jiff::Timestamp::now();
    join_node_group(&env, "ng-a").await?;
    join_node_group(&env, "ng-b").await?;
    let unneeded = env.await_world("scale-down-unneeded", "ng-a").await;
    assert_eq!(
        unneeded.detail["taint"],
        "DeletionCandidateOfClusterAutoscaler"
    );
    assert_eq!(unneeded.detail["effect"], "PreferNoSchedule");
    let node = env.node("ng-a").await?.ok_or("ng-a is there")?;
    let soft = taint(&node, "DeletionCandidateOfClusterAutoscaler").ok_or("soft-tainted")?;
    assert_eq!(soft.effect, "PreferNoSchedule");
    let failed = env.await_world("scale-down-failed", "ng-a").await;
    let first = env
        .world("scale-down-tainted", "ng-a")
        .into_iter()
        .next()
        .ok_or("tainted before it failed")?;
    // Audit times have whole milliseconds.
    assert!(
        unneeded.seq < first.seq
            && time_of(&first)?.duration_since(joined) >= jiff::SignedDuration::from_millis(999),
        "drained only after the unneeded time: joined at {joined}, unneeded at {}, drained at {}",
        unneeded.time,
        first.time
    );
    assert_eq!(failed.detail["untainted"], true);
    assert!(
        env.attempts("db-0", CA)
            .iter()
            .all(|(code, _)| *code == 429),
        "the gate refused every attempt"
    );
    // ng-b's pod is not safe to evict: never unneeded, never tainted.
    assert!(env.world("scale-down-unneeded", "ng-b").is_empty());
    assert!(env.world("scale-down-tainted", "ng-b").is_empty());
    // The gate now allows: CA comes back to the node, still unneeded, and removes it.
    env.gate.deny.store(false, Ordering::SeqCst);
    let deleted = env.await_world("scale-down-deleted", "ng-a").await;
    // The gate may still refuse the next attempt if it starts before the test allows: CA then fails
    // and comes back once more.
    let tainted = env.world("scale-down-tainted", "ng-a");
    assert!(tainted.len() >= 2, "a second scale-down: {tainted:?}");
    assert!(
        time_of(&tainted[1])?.duration_since(time_of(&failed)?)
            >= jiff::SignedDuration::from_millis(499),
        "not before the delay after a failure: {} then {}",
        failed.time,
        tainted[1].time
    );
    assert!(failed.seq < deleted.seq);
    assert!(env.node("ng-b").await?.is_some(), "ng-b stays");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn autoscaler_takes_its_soft_taint_off_a_node_that_is_needed_again() -> TestResult {
    // Upstream: cluster-autoscaler/core/scaledown/actuation/softtaint.go (CleanDeletionCandidate on
    // needed nodes), core/scaledown/eligibility/eligibility.go (scale-down-disabled).
    let slow = "clusterAutoscaler: {scaleDownEnabled: true, scanInterval: 100, \
        scaleDownUnneededTime: 600000}\n";
    let env = Env::start(
        slow,
        false,
        &[(
            "shop",
            "db-0",
            "ng-a",
            json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}),
        )],
    )
    .await?;
    env.running(&[("shop", "db-0")]).await;
    join_node_group(&env, "ng-a").await?;
    env.await_world("scale-down-unneeded", "ng-a").await;
    Api::<Node>::all(env.client.clone())
        .patch(
            "ng-a",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations":
                {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}}})),
        )
        .await?;
    env.await_world("scale-down-needed", "ng-a").await;
    let node = env.node("ng-a").await?.ok_or("ng-a stays")?;
    assert!(taint(&node, "DeletionCandidateOfClusterAutoscaler").is_none());
    assert!(env.world("scale-down-tainted", "ng-a").is_empty());
    Ok(())
}

/// CA's first report of `node` as unremovable for `reason`.
async fn await_verdict(env: &Env, node: &str, reason: &str) -> AuditEntry {
    eventually(&format!("{node} unremovable: {reason}"), || async {
        env.world("scale-down-unremovable", node)
            .into_iter()
            .find(|e| e.detail["reason"] == reason)
    })
    .await
}

/// A pod bound to `node` requesting `cpu`, that CA may move (`safe-to-evict: "true"`).
async fn busy_pod(env: &Env, name: &str, node: &str, cpu: &str) -> TestResult {
    let p: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "nginx:1.27",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}))?;
    Api::<Pod>::namespaced(env.client.clone(), "default")
        .create(&Default::default(), &p)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn autoscaler_keeps_a_busy_node_and_one_whose_pods_fit_nowhere_else() -> TestResult {
    // Upstream: cluster-autoscaler/core/scaledown/eligibility/eligibility.go (NotUnderutilized at or
    // above --scale-down-utilization-threshold), simulator/cluster.go (NoPlaceToMovePods when a pod to
    // move fits on no other node), simulator/utilization/info.go (requests over allocatable).
    let slow = "clusterAutoscaler: {scaleDownEnabled: true, scanInterval: 100, \
        scaleDownUnneededTime: 600000}\n";
    let env = Env::start(slow, false, &[]).await?;
    // m5.large: 1920m allocatable. ng-a is below half; its pod fits on neither busy node.
    busy_pod(&env, "small", "ng-a", "900m").await?;
    busy_pod(&env, "big-b", "ng-b", "1500m").await?;
    busy_pod(&env, "big-c", "ng-c", "1500m").await?;
    for n in ["ng-a", "ng-b", "ng-c"] {
        join_node_group(&env, n).await?;
    }
    let stuck = await_verdict(&env, "ng-a", "NoPlaceToMovePods").await;
    assert!(
        stuck.detail["message"]
            .as_str()
            .is_some_and(|m| m.contains("default/small")),
        "{stuck:?}"
    );
    let busy = await_verdict(&env, "ng-b", "NotUnderutilized").await;
    let u = busy.detail["utilization"].as_f64().ok_or("a utilisation")?;
    assert!((u - 1500.0 / 1920.0).abs() < 1e-6, "{u}");
    assert!(env.world("scale-down-unneeded", "ng-a").is_empty());
    // Room on ng-c: ng-a's pod can move, and ng-a is unneeded.
    Api::<Pod>::namespaced(env.client.clone(), "default")
        .delete("big-c", &Default::default())
        .await?;
    env.await_world("scale-down-unneeded", "ng-a").await;
    assert!(env.world("scale-down-unneeded", "ng-b").is_empty());
    Ok(())
}
