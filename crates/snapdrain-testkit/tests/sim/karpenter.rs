//! Simulated Karpenter v1 driven from outside: NodeClaims launch through a cloud whose instances join
//! as Nodes (ec2_nodes), drift is replaced within budgets unless do-not-disrupt holds a node, and a
//! deleted NodeClaim is drained through the eviction API before its instance is terminated.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::apiserver::store::{DeleteOptions, WriteOptions};
use snapdrain_sim::world::ec2_nodes::{self, BootedInstance, InstanceChange};
use snapdrain_sim::world::feed::Feed;
use snapdrain_sim::world::karpenter::{
    self, Cloud, CloudFuture, KarpenterConfig, KarpenterHandle, LaunchRequest, Launched,
    nodeclaim_from_pool,
};
use snapdrain_sim::world::{Timings, WorldContext};
use snapdrain_sim::{SimCluster, SimConfig, manifests};
use tokio::sync::broadcast;

const INTERNAL: WriteOptions = WriteOptions {
    dry_run: false,
    internal: true,
};

/// A cloud whose instances boot after a short delay and report through instance events.
struct FakeCloud {
    events: broadcast::Sender<InstanceChange>,
    terminated: Mutex<Vec<String>>,
}

impl Cloud for FakeCloud {
    fn launch(&self, req: LaunchRequest) -> CloudFuture<'_, Launched> {
        Box::pin(async move {
            let id = format!("i-{}", &uuid::Uuid::new_v4().simple().to_string()[..17]);
            // Karpenter launches with the AMI its EC2NodeClass maps to the NodeClaim.
            let image_id = req
                .image_id
                .clone()
                .unwrap_or_else(|| "ami-0bottlerocket".into());
            let inst = BootedInstance {
                id: id.clone(),
                instance_type: req.instance_type,
                zone: "us-west-2a".into(),
                private_dns_name: format!("ip-{}.us-west-2.compute.internal", &id[2..10]),
                image_id: image_id.clone(),
                spot: req.capacity_type == "spot",
                node_labels: req.labels,
                node_taints: req.taints,
                ..Default::default()
            };
            let tx = self.events.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = tx.send(InstanceChange::Booted(inst));
            });
            Ok(Launched {
                id,
                zone: "us-west-2a".into(),
                image_id,
            })
        })
    }

    fn terminate(&self, id: &str) -> CloudFuture<'_, ()> {
        let id = id.to_string();
        Box::pin(async move {
            self.terminated.lock().unwrap().push(id.clone());
            let _ = self.events.send(InstanceChange::Terminated { id });
            Ok(())
        })
    }

    fn exists(&self, id: &str) -> CloudFuture<'_, bool> {
        let gone = self.terminated.lock().unwrap().iter().any(|t| t == id);
        Box::pin(async move { Ok(!gone) })
    }
}

struct Env {
    _cluster: SimCluster,
    ctx: Arc<WorldContext>,
    cloud: Arc<FakeCloud>,
    _karpenter: KarpenterHandle,
}

fn crds() -> Vec<Value> {
    let dirs = [
        concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/crds/karpenter"),
        "/work/shared/fixtures/crds/karpenter",
    ];
    let dir = dirs
        .iter()
        .find(|d| std::path::Path::new(d).is_dir())
        .expect("karpenter CRD fixtures");
    let mut out = Vec::new();
    for f in [
        "karpenter.sh_nodepools.yaml",
        "karpenter.sh_nodeclaims.yaml",
    ] {
        out.extend(
            manifests::parse_objects(&std::fs::read_to_string(format!("{dir}/{f}")).unwrap(), f)
                .unwrap(),
        );
    }
    out
}

fn pool(budget: &'static str) -> Value {
    NodePool::new("default").budget(budget).build()
}

/// A NodePool for the tests, with the disruption settings they vary.
struct NodePool {
    name: &'static str,
    budget: &'static str,
    policy: &'static str,
    consolidate_after: &'static str,
    expire_after: &'static str,
    tgp: Option<&'static str>,
}

impl NodePool {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            budget: "100%",
            policy: "WhenEmptyOrUnderutilized",
            consolidate_after: "Never",
            expire_after: "720h",
            tgp: None,
        }
    }
    fn budget(self, budget: &'static str) -> Self {
        Self { budget, ..self }
    }
    fn consolidation(self, policy: &'static str, after: &'static str) -> Self {
        Self {
            policy,
            consolidate_after: after,
            ..self
        }
    }
    fn expiry(self, expire_after: &'static str, tgp: &'static str) -> Self {
        Self {
            expire_after,
            tgp: Some(tgp),
            ..self
        }
    }
    fn build(self) -> Value {
        let mut spec = json!({"expireAfter": self.expire_after, "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large"]}]});
        if let Some(t) = self.tgp {
            spec["terminationGracePeriod"] = json!(t);
        }
        json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": self.name},
            "spec": {"disruption": {"consolidationPolicy": self.policy, "consolidateAfter": self.consolidate_after, "budgets": [{"nodes": self.budget}]},
                     "template": {"metadata": {"labels": {"team": "db"}}, "spec": spec}}})
    }
}

impl Env {
    async fn start(budget: &'static str) -> Self {
        Self::with_pools(vec![pool(budget)]).await
    }

    async fn with_pools(pools: Vec<Value>) -> Self {
        let mut objects = crds();
        objects.extend(pools);
        objects.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "db"}}));
        let cluster = SimCluster::start(SimConfig {
            objects,
            ..Default::default()
        })
        .await
        .unwrap();
        let ctx = Arc::new(WorldContext::new(
            cluster.store.clone(),
            cluster.audit.clone(),
            cluster.faults.clone(),
            Timings::default(),
        ));
        let (tx, rx) = broadcast::channel(256);
        tokio::spawn(ec2_nodes::run(ctx.clone(), rx));
        let cloud = Arc::new(FakeCloud {
            events: tx,
            terminated: Mutex::new(Vec::new()),
        });
        let client = karpenter::api_client(cluster.kube_config()).unwrap();
        let mut config = KarpenterConfig::new(cloud.clone(), client);
        config.disruption_interval = Duration::from_millis(300);
        config.requeue = Duration::from_millis(50);
        let handle = KarpenterHandle::new();
        tokio::spawn(karpenter::run(ctx.clone(), config, handle.clone()));
        Self {
            _cluster: cluster,
            ctx,
            cloud,
            _karpenter: handle,
        }
    }

    /// Deletes NodeClaim `name`, as a person or a controller would: Karpenter's finalizer runs.
    fn delete_claim(&self, name: &str) {
        self.ctx
            .store
            .delete(
                &ResKey::new("karpenter.sh", "nodeclaims"),
                None,
                name,
                &DeleteOptions::default(),
            )
            .unwrap();
    }

    /// Waits until the deleting NodeClaim `name` reports a drain under way (`Drained=Unknown`).
    async fn wait_drain_reported(&self, name: &str) {
        self.wait_for("drain reported", |e| {
            e.claim(name).is_some_and(|c| {
                c["status"]["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|c| c["type"] == "Drained" && c["status"] == "Unknown")
            })
        })
        .await;
    }

    fn claim(&self, name: &str) -> Option<Value> {
        self.ctx
            .store
            .get(&ResKey::new("karpenter.sh", "nodeclaims"), None, name)
            .map(|c| (*c).clone())
    }

    /// Creates a NodeClaim from the pool and waits until its Node is initialized; returns the node name.
    async fn node(&self, name: &str) -> String {
        self.node_in(name, "default").await
    }

    async fn node_in(&self, name: &str, pool: &str) -> String {
        let pool = self
            .ctx
            .store
            .get(&ResKey::new("karpenter.sh", "nodepools"), None, pool)
            .unwrap();
        let mut c = nodeclaim_from_pool(&pool);
        c["metadata"]["name"] = json!(name);
        self.ctx
            .store
            .create(
                &ResKey::new("karpenter.sh", "nodeclaims"),
                None,
                c,
                INTERNAL,
            )
            .unwrap();
        self.wait_for(&format!("{name} initialized"), |e| {
            e.claim(name).is_some_and(|c| initialized(&c))
        })
        .await;
        self.claim(name).unwrap()["status"]["nodeName"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn pod(&self, name: &str, node: &str, annotations: Value, pvc: Option<&str>) {
        let volumes = match pvc {
            Some(c) => json!([{"name": "data", "persistentVolumeClaim": {"claimName": c}}]),
            None => json!([]),
        };
        self.ctx.store.create(&ResKey::core("pods"), Some("db"), json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "db", "labels": {"app": "pg"}, "annotations": annotations},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "postgres"}], "volumes": volumes},
            "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()}]}}), INTERNAL).unwrap();
    }

    fn node_obj(&self, node: &str) -> Option<Arc<Value>> {
        self.ctx.store.get(&ResKey::core("nodes"), None, node)
    }

    fn drift(&self, name: &str) {
        self.ctx.store.modify(&ResKey::new("karpenter.sh", "nodeclaims"), None, name, None, INTERNAL, |cur| {
            let mut v = cur.clone();
            v["status"]["conditions"].as_array_mut().unwrap().push(json!({"type": "Drifted", "status": "True", "reason": "AMIDrift", "message": "AMIDrift", "lastTransitionTime": "2026-01-01T00:00:00Z"}));
            Ok(v)
        }).unwrap();
    }

    async fn wait_for(&self, what: &str, f: impl Fn(&Env) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut rx = self.ctx.audit.follow();
        while !f(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            let _ = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await;
        }
    }

    fn audit(&self, verb: &str) -> Vec<(u64, String, Value)> {
        self.ctx
            .audit
            .since(0)
            .into_iter()
            .filter(|e| e.verb == verb)
            .map(|e| (e.seq, e.name.unwrap_or_default(), e.detail))
            .collect()
    }
}

fn initialized(c: &Value) -> bool {
    c["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Initialized" && c["status"] == "True")
    })
}

#[tokio::test]
async fn nodeclaims_launch_register_and_own_their_nodes() {
    let env = Env::start("100%").await;
    let node = env.node("default-a").await;
    let n = env
        .ctx
        .store
        .get(&ResKey::core("nodes"), None, &node)
        .unwrap();
    let claim = env.claim("default-a").unwrap();
    assert_eq!(n["spec"]["providerID"], claim["status"]["providerID"]);
    assert_eq!(n["metadata"]["labels"]["karpenter.sh/nodepool"], "default");
    assert_eq!(n["metadata"]["labels"]["team"], "db");
    assert_eq!(
        n["metadata"]["finalizers"],
        json!(["karpenter.sh/termination"])
    );
    assert_eq!(n["metadata"]["ownerReferences"][0]["kind"], "NodeClaim");
    assert!(
        n["status"]["nodeInfo"]["osImage"]
            .as_str()
            .unwrap()
            .starts_with("Bottlerocket")
    );
    assert_eq!(
        claim["metadata"]["finalizers"],
        json!(["karpenter.sh/termination"])
    );
}

#[tokio::test]
async fn drift_replaces_drifted_nodes_unless_do_not_disrupt_holds_them() {
    let env = Env::start("100%").await;
    let na = env.node("default-a").await;
    let nb = env.node("default-b").await;
    let nc = env.node("default-c").await;
    env.pod("pg-0", &na, json!({}), None);
    env.pod("pg-1", &nb, json!({}), None);
    env.pod(
        "pg-2",
        &nc,
        json!({"karpenter.sh/do-not-disrupt": "true"}),
        None,
    );
    for c in ["default-a", "default-b", "default-c"] {
        env.drift(c);
    }
    env.wait_for("a and b replaced", |e| {
        e.claim("default-a").is_none() && e.claim("default-b").is_none()
    })
    .await;
    for node in [&na, &nb] {
        assert!(
            env.ctx
                .store
                .get(&ResKey::core("nodes"), None, node)
                .is_none(),
            "{node} removed"
        );
    }
    assert_eq!(env.cloud.terminated.lock().unwrap().len(), 2);
    let started: Vec<_> = env.audit("disruption-started");
    assert!(started.iter().all(|(_, n, d)| n != "default-c"
        && d["reason"] == "Drifted"
        && d["decision"] == "replace"));
    // Every replacement was initialized before its candidate was deleted.
    for (seq, name, d) in &started {
        let replacement = d["replacement"].as_str().unwrap();
        let init = env
            .audit("nodeclaim-initialized")
            .into_iter()
            .find(|(_, n, _)| n == replacement)
            .expect("replacement initialized")
            .0;
        let term = env
            .audit("disruption-terminating")
            .into_iter()
            .find(|(_, n, _)| n == name)
            .unwrap()
            .0;
        assert!(seq < &init && init < term);
    }
    assert!(env.claim("default-c").is_some());
    let blocked = env.audit("disruption-blocked");
    assert!(
        blocked.iter().any(|(_, n, d)| n == "default-c"
            && d["reason"].as_str().unwrap().contains("do-not-disrupt"))
    );
    // The held node was never tainted.
    let n = env
        .ctx
        .store
        .get(&ResKey::core("nodes"), None, &nc)
        .unwrap();
    assert!(
        n["spec"]["taints"]
            .as_array()
            .is_none_or(|t| t.iter().all(|t| t["key"] != "karpenter.sh/disrupted"))
    );
}

#[tokio::test]
async fn budgets_limit_concurrent_disruptions() {
    let env = Env::start("1").await;
    let names = ["default-a", "default-b", "default-c"];
    for n in names {
        let node = env.node(n).await;
        env.pod(&format!("pod-{n}"), &node, json!({}), None);
    }
    for n in names {
        env.drift(n);
    }
    env.wait_for("all replaced", |e| {
        names.iter().all(|n| e.claim(n).is_none())
    })
    .await;
    let mut events: Vec<(u64, i32)> = env
        .audit("disruption-started")
        .into_iter()
        .filter(|(_, n, _)| names.contains(&n.as_str()))
        .map(|(s, _, _)| (s, 1))
        .collect();
    events.extend(
        env.audit("nodeclaim-terminated")
            .into_iter()
            .filter(|(_, n, _)| names.contains(&n.as_str()))
            .map(|(s, _, _)| (s, -1)),
    );
    events.sort();
    let (mut cur, mut max) = (0, 0);
    for (_, d) in events {
        cur += d;
        max = max.max(cur);
    }
    assert_eq!(max, 1, "budget nodes=1 allows one disruption at a time");
}

#[tokio::test]
async fn deletion_drains_waits_for_volume_detach_then_terminates() {
    let env = Env::start("100%").await;
    let node = env.node("default-a").await;
    env.ctx.store.create(&ResKey::core("persistentvolumes"), None, json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-1"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}}), INTERNAL).unwrap();
    env.ctx.store.create(&ResKey::core("persistentvolumeclaims"), Some("db"), json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data-pg-0", "namespace": "db"},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1", "resources": {"requests": {"storage": "1Gi"}}}}), INTERNAL).unwrap();
    env.ctx.store.create(&ResKey::new("storage.k8s.io", "volumeattachments"), None, json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "csi-1"},
        "spec": {"attacher": "ebs.csi.aws.com", "nodeName": node, "source": {"persistentVolumeName": "pv-1"}}}), INTERNAL).unwrap();
    env.pod("pg-0", &node, json!({}), Some("data-pg-0"));
    env.pod("web-0", &node, json!({}), None);
    env.delete_claim("default-a");
    env.wait_for("awaiting volume detachment", |e| {
        e.claim("default-a").is_some_and(|c| {
            c["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| {
                    c["type"] == "VolumesDetached" && c["reason"] == "AwaitingVolumeDetachment"
                })
        })
    })
    .await;
    let evicted: BTreeSet<String> = env
        .audit("eviction-attempt")
        .into_iter()
        .filter(|(_, _, d)| d["code"] == 201)
        .map(|(_, n, _)| n)
        .collect();
    assert_eq!(
        evicted,
        BTreeSet::from(["pg-0".to_string(), "web-0".to_string()])
    );
    assert!(
        env.cloud.terminated.lock().unwrap().is_empty(),
        "no termination while a volume is attached"
    );
    let n = env
        .ctx
        .store
        .get(&ResKey::core("nodes"), None, &node)
        .unwrap();
    assert!(
        n["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["key"] == "karpenter.sh/disrupted" && t.get("value").is_none())
    );
    env.ctx
        .store
        .delete(
            &ResKey::new("storage.k8s.io", "volumeattachments"),
            None,
            "csi-1",
            &DeleteOptions::default(),
        )
        .unwrap();
    env.wait_for("nodeclaim gone", |e| e.claim("default-a").is_none())
        .await;
    assert_eq!(env.cloud.terminated.lock().unwrap().len(), 1);
    env.wait_for("node gone", |e| {
        e.ctx
            .store
            .get(&ResKey::core("nodes"), None, &node)
            .is_none()
    })
    .await;
}

#[tokio::test]
async fn do_not_disrupt_pod_holds_a_forceful_drain() {
    let env = Env::start("100%").await;
    let node = env.node("default-a").await;
    env.pod(
        "pg-0",
        &node,
        json!({"karpenter.sh/do-not-disrupt": "true"}),
        None,
    );
    env.pod("web-0", &node, json!({}), None);
    env.delete_claim("default-a");
    env.wait_for("web-0 evicted", |e| {
        e.ctx
            .store
            .get(&ResKey::core("pods"), Some("db"), "web-0")
            .is_none()
    })
    .await;
    // Without a terminationGracePeriod the held pod is never evicted and the node stays.
    env.wait_drain_reported("default-a").await;
    assert!(
        env.ctx
            .store
            .get(&ResKey::core("pods"), Some("db"), "pg-0")
            .is_some()
    );
    assert!(env.cloud.terminated.lock().unwrap().is_empty());
    // Removing the annotation releases it.
    env.ctx
        .store
        .modify(
            &ResKey::core("pods"),
            Some("db"),
            "pg-0",
            None,
            INTERNAL,
            |cur| {
                let mut v = cur.clone();
                v["metadata"]["annotations"] = json!({});
                Ok(v)
            },
        )
        .unwrap();
    env.wait_for("nodeclaim gone", |e| e.claim("default-a").is_none())
        .await;
}

/// A drain held by a do-not-disrupt pod (no terminationGracePeriod) ends once the instance is gone and
/// the Node is not Ready (spot reclaimed it meanwhile): Karpenter's node termination controller removes
/// the Node's finalizer when the cloud provider no longer finds the instance
/// (kubernetes-sigs/karpenter `pkg/controllers/node/termination/controller.go`), the pod garbage
/// collector takes the pods bound to it, and the NodeClaim goes.
#[tokio::test]
async fn a_held_drain_ends_when_the_instance_is_gone_and_the_node_not_ready() {
    let env = Env::start("100%").await;
    // The kubelets and the pod garbage collector, which take the pods of a Node that is gone.
    tokio::spawn(snapdrain_sim::world::kubelet::run(env.ctx.clone()));
    let node = env.node("default-a").await;
    env.pod(
        "pg-0",
        &node,
        json!({"karpenter.sh/do-not-disrupt": "true"}),
        None,
    );
    env.delete_claim("default-a");
    env.wait_drain_reported("default-a").await;
    assert!(
        env.ctx
            .store
            .get(&ResKey::core("nodes"), None, &node)
            .is_some(),
        "held by the drain"
    );
    // EC2 reclaims the instance (a spot interruption's deadline): its Node goes NotReady.
    let id = env.claim("default-a").unwrap()["status"]["providerID"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    env.cloud.terminate(&id).await.unwrap();
    env.wait_for("node, held pod and nodeclaim gone", |e| {
        e.ctx
            .store
            .get(&ResKey::core("nodes"), None, &node)
            .is_none()
            && e.ctx
                .store
                .get(&ResKey::core("pods"), Some("db"), "pg-0")
                .is_none()
            && e.claim("default-a").is_none()
    })
    .await;
}

#[tokio::test]
async fn deletion_drain_respects_pdbs_through_eviction() {
    let env = Env::start("100%").await;
    let node = env.node("default-a").await;
    env.pod("pg-0", &node, json!({}), None);
    env.ctx.store.create(&ResKey::new("policy", "poddisruptionbudgets"), Some("db"), json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pg", "namespace": "db"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "pg"}}}, "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}), INTERNAL).unwrap();
    env.delete_claim("default-a");
    env.wait_for("a 429", |e| {
        e.audit("eviction-attempt")
            .iter()
            .any(|(_, _, d)| d["code"] == 429)
    })
    .await;
    assert!(
        env.ctx
            .store
            .get(&ResKey::core("pods"), Some("db"), "pg-0")
            .is_some()
    );
    assert!(env.cloud.terminated.lock().unwrap().is_empty());
}

fn condition<'a>(c: &'a Value, type_: &str) -> Option<&'a Value> {
    c["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn consolidatable(c: &Value) -> bool {
    condition(c, "Consolidatable").is_some_and(|c| c["status"] == "True")
}

// K: pkg/controllers/nodeclaim/disruption/consolidation.go, pkg/controllers/nodeclaim/podevents/controller.go
#[tokio::test]
async fn consolidatable_follows_consolidate_after_and_never_disables_it() {
    let env = Env::with_pools(vec![
        NodePool::new("never")
            .consolidation("WhenEmpty", "Never")
            .build(),
        NodePool::new("soon")
            .consolidation("WhenEmpty", "3s")
            .build(),
    ])
    .await;
    let n_never = env.node_in("never-a", "never").await;
    env.pod("web-0", &n_never, json!({}), None);
    let n_soon = env.node_in("soon-a", "soon").await;
    env.pod("web-1", &n_soon, json!({}), None);
    env.wait_for("soon-a Consolidatable", |e| {
        e.claim("soon-a").is_some_and(|c| consolidatable(&c))
    })
    .await;
    let soon = env.claim("soon-a").unwrap();
    assert!(soon["status"]["lastPodEventTime"].is_string());
    // The never pool's NodeClaim saw its pod event earlier, yet consolidation is off for it.
    let never = env.claim("never-a").unwrap();
    assert!(never["status"]["lastPodEventTime"].is_string());
    assert!(condition(&never, "Consolidatable").is_none());
    // A new pod restarts the clock: the condition goes, then comes back after consolidateAfter.
    env.pod("web-2", &n_soon, json!({}), None);
    env.wait_for("soon-a no longer Consolidatable", |e| {
        e.claim("soon-a").is_some_and(|c| !consolidatable(&c))
    })
    .await;
    env.wait_for("soon-a Consolidatable again", |e| {
        e.claim("soon-a").is_some_and(|c| consolidatable(&c))
    })
    .await;
}

// K: pkg/controllers/disruption/singlenodeconsolidation.go, consolidation.go
#[tokio::test]
async fn underutilized_node_is_consolidated_unless_do_not_disrupt_holds_it() {
    let env = Env::with_pools(vec![
        NodePool::new("default")
            .consolidation("WhenEmptyOrUnderutilized", "2s")
            .build(),
    ])
    .await;
    let (mut claim_feed, _) = Feed::open(&env.ctx.store, ResKey::new("karpenter.sh", "nodeclaims"));
    let (mut node_feed, _) = Feed::open(&env.ctx.store, ResKey::core("nodes"));
    let na = env.node("default-a").await;
    env.pod("web-0", &na, json!({}), None);
    let nb = env.node("default-b").await;
    env.pod(
        "pg-0",
        &nb,
        json!({"karpenter.sh/do-not-disrupt": "true"}),
        None,
    );
    env.wait_for("default-a consolidated", |e| {
        e.claim("default-a").is_none() && e.node_obj(&na).is_none()
    })
    .await;
    // As drift does: DisruptionReason on the NodeClaim and the disrupted taint on its Node before
    // the NodeClaim is deleted.
    let marked = claim_feed
        .try_recv()
        .into_iter()
        .filter_map(|c| c.new)
        .any(|c| {
            c["metadata"]["name"] == "default-a"
                && c["metadata"]["deletionTimestamp"].is_null()
                && condition(&c, "DisruptionReason").is_some_and(|d| d["reason"] == "Underutilized")
        });
    assert!(marked, "DisruptionReason=Underutilized before deletion");
    let tainted = node_feed
        .try_recv()
        .into_iter()
        .filter_map(|c| c.new)
        .any(|n| {
            n["metadata"]["name"] == na.as_str()
                && n["metadata"]["deletionTimestamp"].is_null()
                && n["spec"]["taints"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t["key"] == "karpenter.sh/disrupted"))
        });
    assert!(tainted, "karpenter.sh/disrupted taint before deletion");
    let started = env.audit("disruption-started");
    assert!(started.iter().any(|(_, n, d)| n == "default-a"
        && d["reason"] == "Underutilized"
        && d["decision"] == "delete"
        && d["replacement"].is_null()));
    assert!(
        env.audit("eviction-attempt")
            .iter()
            .any(|(_, n, d)| n == "web-0" && d["code"] == 201)
    );
    // Once default-b is Consolidatable too, its do-not-disrupt pod keeps it.
    env.wait_for("default-b blocked", |e| {
        e.audit("disruption-blocked").iter().any(|(_, n, d)| {
            n == "default-b" && d["reason"].as_str().unwrap().contains("do-not-disrupt")
        })
    })
    .await;
    assert!(env.claim("default-b").is_some_and(|c| consolidatable(&c)));
    assert!(
        env.audit("disruption-started")
            .iter()
            .all(|(_, n, _)| n != "default-b")
    );
}

// K: pkg/controllers/disruption/consolidation.go (simulated scheduling), and the scheduler's
// VolumeBinding zone check.
#[tokio::test]
async fn pod_with_a_zonal_volume_fits_only_in_its_zone() {
    let env = Env::with_pools(vec![
        NodePool::new("default")
            .consolidation("WhenEmptyOrUnderutilized", "2s")
            .build(),
    ])
    .await;
    env.ctx.store.create(&ResKey::core("persistentvolumes"), None, json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-b", "labels": {"topology.kubernetes.io/zone": "us-west-2b"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-b"}}}), INTERNAL).unwrap();
    env.ctx.store.create(&ResKey::core("persistentvolumeclaims"), Some("db"), json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data-pg-0", "namespace": "db"},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-b", "resources": {"requests": {"storage": "1Gi"}}}}), INTERNAL).unwrap();
    let na = env.node("default-a").await;
    env.pod("pg-0", &na, json!({}), Some("data-pg-0"));
    let nb = env.node("default-b").await;
    env.pod(
        "pg-1",
        &nb,
        json!({"karpenter.sh/do-not-disrupt": "true"}),
        None,
    );
    env.wait_for("default-a found unconsolidatable", |e| {
        e.audit("disruption-blocked").iter().any(|(_, n, d)| {
            n == "default-a"
                && d["reason"]
                    .as_str()
                    .unwrap()
                    .contains("volume node affinity conflict")
        })
    })
    .await;
    assert!(env.claim("default-a").is_some());
    assert!(
        env.audit("disruption-started")
            .iter()
            .all(|(_, n, _)| n != "default-a")
    );
}

// K: pkg/controllers/disruption/consolidation.go `ShouldDisrupt` (WhenEmpty leaves non-empty nodes)
#[tokio::test]
async fn when_empty_does_not_consolidate_a_non_empty_node() {
    let env = Env::with_pools(vec![
        NodePool::new("default")
            .consolidation("WhenEmpty", "2s")
            .build(),
        NodePool::new("under")
            .consolidation("WhenEmptyOrUnderutilized", "2s")
            .build(),
    ])
    .await;
    let host = env.node("default-host").await;
    env.pod(
        "pg-0",
        &host,
        json!({"karpenter.sh/do-not-disrupt": "true"}),
        None,
    );
    let na = env.node("default-a").await;
    env.pod("web-0", &na, json!({}), None);
    let nb = env.node_in("under-b", "under").await;
    env.pod("web-1", &nb, json!({}), None);
    // default-a became Consolidatable no later than under-b, so the passes that consolidated
    // under-b also saw default-a as Consolidatable.
    env.wait_for("under-b consolidated", |e| e.claim("under-b").is_none())
        .await;
    let a = env.claim("default-a").unwrap();
    assert!(consolidatable(&a));
    let started = env.audit("disruption-started");
    assert!(
        started
            .iter()
            .any(|(_, n, d)| n == "under-b" && d["reason"] == "Underutilized")
    );
    assert!(started.iter().all(|(_, n, _)| n != "default-a"));
}

// K: pkg/controllers/nodeclaim/expiration/controller.go, pkg/controllers/nodeclaim/lifecycle/controller.go
// (termination timestamp), pkg/controllers/node/termination/terminator/terminator.go (TGP deletes)
#[tokio::test]
async fn expired_nodeclaim_is_drained_despite_do_not_disrupt_until_the_grace_period() {
    let env = Env::with_pools(vec![NodePool::new("default").expiry("4s", "2s").build()]).await;
    let node = env.node("default-a").await;
    env.pod(
        "pg-0",
        &node,
        json!({"karpenter.sh/do-not-disrupt": "true"}),
        None,
    );
    env.pod("web-0", &node, json!({}), None);
    env.wait_for("termination timestamp written", |e| {
        e.claim("default-a").is_some_and(|c| {
            c["metadata"]["annotations"]["karpenter.sh/nodeclaim-termination-timestamp"].is_string()
        })
    })
    .await;
    let c = env.claim("default-a").unwrap();
    let deleted: jiff::Timestamp = c["metadata"]["deletionTimestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let at: jiff::Timestamp =
        c["metadata"]["annotations"]["karpenter.sh/nodeclaim-termination-timestamp"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    assert_eq!(at.duration_since(deleted).as_secs(), 2);
    env.wait_for("nodeclaim gone", |e| e.claim("default-a").is_none())
        .await;
    assert!(
        env.audit("disruption-started")
            .iter()
            .any(|(_, n, d)| n == "default-a" && d["reason"] == "Expired" && d["forceful"] == true)
    );
    // The held pod was never evicted: it was deleted once the grace period ran out.
    assert!(
        env.audit("eviction-attempt")
            .iter()
            .all(|(_, n, _)| n != "pg-0")
    );
    assert!(
        env.audit("pod-deleted")
            .iter()
            .any(|(_, n, d)| n == "pg-0" && d["reason"] == "TerminationGracePeriodExpiring")
    );
    // A DELETE through the API server (terminator/eviction.go forceDelete), which no PDB or eviction
    // webhook sees: accepted, on the pod named.
    assert!(env.ctx.audit.since(0).iter().any(|e| e.source == "api"
        && e.verb == "delete"
        && e.resource == "pods"
        && e.name.as_deref() == Some("pg-0")
        && e.code == Some(200)));
    assert!(
        env.audit("eviction-attempt")
            .iter()
            .any(|(_, n, d)| n == "web-0" && d["code"] == 201)
    );
    assert_eq!(env.cloud.terminated.lock().unwrap().len(), 1);
    env.wait_for("node gone", |e| e.node_obj(&node).is_none())
        .await;
}

/// A scenario whose NodePool expires its node in seconds, with a grace period shorter than the pod's.
const EXPIRING: &str = r#"
name: expiring
nodePools:
  - name: default
    consolidateAfter: Never
    expireAfter: 3s
    terminationGracePeriod: 2s
nodes:
  - count: 1
    instanceType: m6i.xlarge
    zones: [us-east-1a]
    karpenter: {nodePool: default}
namespaces: [db]
statefulSets:
  - name: pg
    namespace: db
    replicas: 1
    pod: {image: "postgres:17", cpu: 100m, memory: 128Mi, annotations: {karpenter.sh/do-not-disrupt: "true"}}
"#;

// K: pkg/controllers/nodeclaim/expiration/controller.go; the scenario's expireAfter and
// terminationGracePeriod reach the NodeClaim as the NodePool template's would.
#[tokio::test]
async fn scenario_nodepool_durations_expire_the_node_in_the_running_world() {
    let scenario = snapdrain_sim::scenario::parse(EXPIRING, "expiring.yaml").unwrap();
    let cluster = SimCluster::start(SimConfig {
        scenario: Some(snapdrain_sim::ScenarioSource::Inline {
            scenario: Box::new(scenario),
            label: "expiring".into(),
        }),
        timings: Some(Timings {
            pod_start: Duration::from_millis(20),
            pod_stop: Duration::from_millis(20),
            volume_detach: Duration::from_millis(20),
            instance_boot: Duration::from_millis(200),
            ..Timings::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let claims = ResKey::new("karpenter.sh", "nodeclaims");
    let (initial, _) = cluster.store.snapshot(&claims);
    assert_eq!(initial.len(), 1);
    assert_eq!(initial[0]["spec"]["expireAfter"], "3s");
    assert_eq!(initial[0]["spec"]["terminationGracePeriod"], "2s");
    let name = initial[0]["metadata"]["name"].as_str().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut rx = cluster.audit.follow();
    while cluster.store.get(&claims, None, &name).is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the expired NodeClaim to go"
        );
        let _ = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await;
    }
    let audit = cluster.audit.since(0);
    assert!(audit.iter().any(|e| e.verb == "disruption-started"
        && e.name.as_deref() == Some(name.as_str())
        && e.detail["reason"] == "Expired"));
    // The do-not-disrupt pod was deleted, never evicted: its 30 s grace exceeds the 2 s left.
    assert!(audit.iter().any(|e| e.verb == "pod-deleted"
        && e.name.as_deref() == Some("pg-0")
        && e.detail["reason"] == "TerminationGracePeriodExpiring"));
    assert!(
        !audit
            .iter()
            .any(|e| e.verb == "eviction-attempt" && e.name.as_deref() == Some("pg-0"))
    );
}

/// Whether the store's NodeClaim indexes (by `status.nodeName`, which pod events are recorded
/// through, and by `status.providerID`) answer what a full scan of the NodeClaims answers, for every
/// value now present and for `extra` values that NodeClaims have left.
fn claim_indexes_agree_with_scan(env: &Env, extra: &[String]) -> bool {
    use snapdrain_sim::apiserver::objects::{CLAIM_NODE, CLAIM_PROVIDER_ID};
    let key = ResKey::new("karpenter.sh", "nodeclaims");
    let (all, _) = env.ctx.store.snapshot(&key);
    let names = |objs: &[Arc<Value>]| -> Vec<String> {
        let mut v: Vec<String> = objs
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect();
        v.sort();
        v
    };
    [CLAIM_NODE, CLAIM_PROVIDER_ID].iter().all(|field| {
        let mut values: BTreeSet<String> = all
            .iter()
            .flat_map(|o| field.values(o))
            .map(str::to_string)
            .collect();
        values.extend(extra.iter().cloned());
        values.iter().all(|v| {
            let scan: Vec<Arc<Value>> = all
                .iter()
                .filter(|o| field.values(o).contains(&v.as_str()))
                .cloned()
                .collect();
            names(&env.ctx.store.by_field(&key, *field, v)) == names(&scan)
        })
    })
}

/// The simulated Karpenter reconciles NodeClaims from a work queue fed by changes (controller-runtime
/// pkg/internal/controller/controller.go, `RequeueAfter`), not by a pass over all of them every
/// 200 ms: a NodeClaim deleted and re-created under the same name is launched and registered again,
/// a NodePool change (consolidateAfter from Never to 1s) reaches every NodeClaim of the pool with
/// nothing else changing, and the clock of consolidateAfter fires on its own. The store's NodeClaim
/// indexes, through which pod events find their NodeClaim, agree with a full scan throughout.
// K: pkg/controllers/nodeclaim/disruption/consolidation.go, pkg/controllers/nodeclaim/podevents/controller.go
#[tokio::test]
async fn nodeclaim_work_queue_follows_recreates_and_pool_changes() {
    let env = Env::with_pools(vec![
        NodePool::new("default")
            .budget("0%")
            .consolidation("WhenEmpty", "Never")
            .build(),
    ])
    .await;
    let claims = ResKey::new("karpenter.sh", "nodeclaims");
    let node_a = env.node("default-a").await;
    env.pod("web-0", &node_a, json!({}), None);
    let first_b = env.node("default-b").await;
    let first_b_pid = env.claim("default-b").unwrap()["status"]["providerID"]
        .as_str()
        .unwrap()
        .to_string();
    env.wait_for("a pod event on default-a", |e| {
        e.claim("default-a")
            .is_some_and(|c| c["status"]["lastPodEventTime"].is_string())
    })
    .await;

    // Deleted (its finalizer runs: the Node goes) and re-created under the same name.
    env.ctx
        .store
        .delete(&claims, None, "default-b", &DeleteOptions::default())
        .unwrap();
    env.wait_for("default-b gone", |e| {
        e.claim("default-b").is_none() && e.node_obj(&first_b).is_none()
    })
    .await;
    let second_b = env.node("default-b").await;
    assert_ne!(second_b, first_b, "the re-created NodeClaim has a new Node");
    assert!(claim_indexes_agree_with_scan(
        &env,
        &[first_b.clone(), first_b_pid.clone()]
    ));
    // A pod on the new Node is recorded on the re-created NodeClaim, found through the index.
    env.pod("web-1", &second_b, json!({}), None);
    env.wait_for("a pod event on the re-created default-b", |e| {
        e.claim("default-b")
            .is_some_and(|c| c["status"]["lastPodEventTime"].is_string())
    })
    .await;
    assert!(
        env.claim("default-a")
            .is_some_and(|c| condition(&c, "Consolidatable").is_none())
    );

    // Only the NodePool changes: both NodeClaims become Consolidatable once 1s has passed since
    // their last pod event.
    env.ctx
        .store
        .modify(
            &ResKey::new("karpenter.sh", "nodepools"),
            None,
            "default",
            None,
            INTERNAL,
            |cur| {
                let mut v = cur.clone();
                v["spec"]["disruption"]["consolidateAfter"] = json!("1s");
                Ok(v)
            },
        )
        .unwrap();
    env.wait_for("both NodeClaims Consolidatable", |e| {
        ["default-a", "default-b"]
            .iter()
            .all(|n| e.claim(n).is_some_and(|c| consolidatable(&c)))
    })
    .await;
    assert!(claim_indexes_agree_with_scan(&env, &[first_b, first_b_pid]));
}

// A: pkg/controllers/nodeclass/{subnet,securitygroup,instanceprofile}.go and status/readiness.go: each
// EC2NodeClass's selectors are resolved into status (subnets with their zones, security groups with
// their names, the role's instance profile) and the root Ready condition; the profile exists in the
// account, so an instance launched with it is accepted.
#[tokio::test]
async fn every_ec2nodeclass_is_resolved_against_the_simulated_account() {
    let cluster = SimCluster::start(SimConfig {
        scenario: Some(snapdrain_sim::ScenarioSource::Named("quickstart".into())),
        ..Default::default()
    })
    .await
    .unwrap();
    let ec2 = cluster.ec2.as_ref().expect("the world runs EC2");
    let (classes, _) = cluster
        .store
        .snapshot(&ResKey::new("karpenter.k8s.aws", "ec2nodeclasses"));
    assert_eq!(classes.len(), 1);
    let status = &classes[0]["status"];
    let subnets: Vec<(String, String)> = status["subnets"]
        .as_array()
        .expect("resolved subnets")
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap_or_default().to_string(),
                s["zone"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = ec2
        .config()
        .subnets
        .iter()
        .map(|s| (s.id.clone(), s.zone.clone()))
        .collect();
    assert_eq!(subnets, want);
    assert_eq!(
        status["securityGroups"],
        json!([{"id": snapdrain_sim::ec2::CLUSTER_SECURITY_GROUP, "name": "eks-cluster-sg-snapdrain-sim"}])
    );
    let profile = status["instanceProfile"].as_str().expect("a profile");
    assert!(
        ec2.config().instance_profiles.iter().any(|p| p == profile),
        "{profile} is not in {:?}",
        ec2.config().instance_profiles
    );
    let ready = status["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "Ready")
        .expect("Ready");
    assert_eq!(ready["status"], "True");
    assert_eq!(
        status["amis"][0]["requirements"],
        json!([{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}])
    );
}
