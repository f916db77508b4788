//! A simulated cluster (quickstart scenario, fast timings) with the snapdrain controller talking to it
//! over HTTP, and helpers to create plans and wait on them by watch.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::{Value, json};
use snapdrain::api::DisruptionPlan;
use snapdrain::api::status::PlanPhase;
use snapdrain::controller::run::RunOptions;
use snapdrain::controller::{ControllerHandle, Settings, start};
use snapdrain_sim::apiserver::audit::AuditEntry;
use snapdrain_sim::scenario::format::VeleroSpec;
use snapdrain_sim::world::Timings;
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};

pub const TIMEOUT: Duration = Duration::from_secs(60);

pub struct Harness {
    pub cluster: SimCluster,
    pub client: Client,
}

pub fn fast_timings() -> Timings {
    Timings {
        pod_start: Duration::from_millis(50),
        pod_stop: Duration::from_millis(50),
        instance_boot: Duration::from_millis(200),
        volume_detach: Duration::from_millis(50),
        backup_mib_per_second: 0.0,
        ebs_snapshot_mib_per_second: 0.0,
        ebs_snapshot_per_volume_interval: snapdrain_sim::ec2::PER_VOLUME_INTERVAL,
        backup_overhead: Duration::from_millis(100),
    }
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(fast_timings()).await
    }

    pub async fn start_with(timings: Timings) -> Self {
        Self::start_with_api(timings, snapdrain_sim::apiserver::Settings::default()).await
    }

    /// The quickstart scenario with the API server's tunables set (e.g. which multi-PDB answer it gives).
    pub async fn start_with_api(timings: Timings, api: snapdrain_sim::apiserver::Settings) -> Self {
        Self::start_source(ScenarioSource::Named("quickstart".into()), timings, api).await
    }

    /// The quickstart scenario with its Velero install changed by `velero` (Helm, IRSA, AWS S3, TLS).
    pub async fn start_with_velero(velero: impl FnOnce(&mut VeleroSpec)) -> Self {
        let (mut scenario, label) =
            snapdrain_sim::scenario::resolve("quickstart").expect("the quickstart scenario exists");
        let spec = scenario
            .velero
            .as_mut()
            .expect("the quickstart scenario installs Velero");
        velero(spec);
        Self::start_source(
            ScenarioSource::Inline {
                scenario: Box::new(scenario),
                label,
            },
            fast_timings(),
            snapdrain_sim::apiserver::Settings::default(),
        )
        .await
    }

    /// A built-in scenario, changed by `edit` (e.g. its timeline removed, so a test drives the
    /// disruption itself once snapdrain runs). Returns once every StatefulSet reports all replicas ready.
    pub async fn start_scenario(
        name: &str,
        edit: impl FnOnce(&mut snapdrain_sim::scenario::format::Scenario),
    ) -> Self {
        Self::start_scenario_with(name, fast_timings(), edit).await
    }

    /// [`Harness::start_scenario`] at `timings`.
    pub async fn start_scenario_with(
        name: &str,
        timings: Timings,
        edit: impl FnOnce(&mut snapdrain_sim::scenario::format::Scenario),
    ) -> Self {
        crate::capture_logs();
        let (mut scenario, label) =
            snapdrain_sim::scenario::resolve(name).expect("a built-in scenario");
        edit(&mut scenario);
        let cluster = SimCluster::start(SimConfig {
            scenario: Some(ScenarioSource::Inline {
                scenario: Box::new(scenario),
                label,
            }),
            timings: Some(timings),
            ..Default::default()
        })
        .await
        .expect("the scenario starts");
        let client = Client::try_from(cluster.kube_config()).expect("client");
        install_plan_crd(&client)
            .await
            .expect("install the DisruptionPlan CRD");
        let h = Self { cluster, client };
        let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::all(h.client.clone());
        h.wait_all(sets, "every StatefulSet ready", |ss| {
            !ss.is_empty()
                && ss.iter().all(|s| {
                    let want = s.spec.as_ref().and_then(|sp| sp.replicas).unwrap_or(1);
                    s.status.as_ref().and_then(|st| st.ready_replicas) == Some(want)
                })
        })
        .await;
        h
    }

    async fn start_source(
        source: ScenarioSource,
        timings: Timings,
        api: snapdrain_sim::apiserver::Settings,
    ) -> Self {
        crate::capture_logs();
        let cluster = SimCluster::start(SimConfig {
            scenario: Some(source),
            timings: Some(timings),
            settings: api,
            ..Default::default()
        })
        .await
        .expect("the scenario starts");
        let client = Client::try_from(cluster.kube_config()).expect("client");
        install_plan_crd(&client)
            .await
            .expect("install the DisruptionPlan CRD");
        let h = Self { cluster, client };
        h.wait_statefulsets_ready().await;
        h
    }

    /// Lets snapdrain's own IAM role ([`crate::SNAPDRAIN_ROLE_ARN`]) read the bucket, as an IAM policy
    /// for its IRSA role would.
    pub fn grant_snapdrain_role(&self) {
        let (ak, sk) = snapdrain_sim::sts::role_credentials(crate::SNAPDRAIN_ROLE_ARN);
        self.cluster
            .s3
            .as_ref()
            .expect("the world runs an S3 endpoint")
            .grant(&ak, &sk);
    }

    pub fn kube_config(&self) -> kube::Config {
        self.cluster.kube_config()
    }

    pub fn settings(&self, identity: &str) -> Settings {
        crate::controller_settings(&self.cluster, identity).expect("the world runs an EC2 endpoint")
    }

    /// A controller without leader election (one replica).
    pub async fn controller(&self) -> ControllerHandle {
        self.controller_with(
            RunOptions {
                lease_namespace: None,
                ..RunOptions::default()
            },
            "snapdrain-0",
        )
        .await
    }

    /// Writes the DisruptionPolicy `default` with `spec` (created, or replaced when the controller made
    /// it). Call it before [`Harness::controller`]: the controller judges plans only once it read the
    /// policy, so a plan created after the controller started is judged by this one.
    pub async fn set_policy(&self, spec: Value) {
        let api: Api<snapdrain::api::DisruptionPolicy> = Api::all(self.client.clone());
        let mut policy: snapdrain::api::DisruptionPolicy = serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": snapdrain::api::DEFAULT_POLICY}, "spec": spec
        }))
        .expect("a DisruptionPolicy");
        match api.create(&PostParams::default(), &policy).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let current = api
                    .get(snapdrain::api::DEFAULT_POLICY)
                    .await
                    .expect("read the policy");
                policy.metadata.resource_version = current.metadata.resource_version;
                api.replace(
                    snapdrain::api::DEFAULT_POLICY,
                    &PostParams::default(),
                    &policy,
                )
                .await
                .expect("replace the policy");
            }
            Err(e) => panic!("create the policy: {e}"),
        }
    }

    pub async fn controller_with(&self, opts: RunOptions, identity: &str) -> ControllerHandle {
        start(self.kube_config(), self.settings(identity), opts)
            .await
            .expect("controller starts")
    }

    async fn wait_statefulsets_ready(&self) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "shop");
        let ready = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let stream = watcher(pods, watcher::Config::default()).default_backoff();
        let mut store = Vec::<Pod>::new();
        let mut stream = std::pin::pin!(stream);
        while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, stream.next()).await {
            match ev {
                Ok(watcher::Event::InitApply(p)) | Ok(watcher::Event::Apply(p)) => {
                    store.retain(|q| q.name_any() != p.name_any());
                    store.push(p);
                }
                Ok(watcher::Event::Delete(p)) => store.retain(|q| q.name_any() != p.name_any()),
                _ => {}
            }
            let sts_ready = store
                .iter()
                .filter(|p| {
                    p.name_any().starts_with("postgres-") || p.name_any().starts_with("redis-")
                })
                .filter(|p| ready(p))
                .count();
            if sts_ready == 5 {
                return;
            }
        }
        panic!("the quickstart StatefulSets did not become Ready within {TIMEOUT:?}");
    }

    /// A node running at least one postgres pod whose zone has another Ready, schedulable node.
    /// The pods' volumes are zonal (the scheduler keeps a pod in its PV's zone), so draining the last
    /// node of a zone leaves the first evicted pod Pending and the PDB blocks the rest for good: a test
    /// that drains twice must not pick such a node, whatever order the pods were first placed in.
    pub async fn node_with_statefulset_pods(&self) -> String {
        const ZONE: &str = "topology.kubernetes.io/zone";
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "shop");
        let list = pods.list(&Default::default()).await.expect("list pods");
        let nodes: Api<Node> = Api::all(self.client.clone());
        let nodes = nodes.list(&Default::default()).await.expect("list nodes");
        let open = |n: &Node| {
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            ready && !cordoned && n.metadata.deletion_timestamp.is_none()
        };
        let zone_of = |name: &str| {
            nodes
                .items
                .iter()
                .find(|n| n.name_any() == name)
                .and_then(|n| n.labels().get(ZONE).cloned())
        };
        let has_sibling = |name: &str| {
            let zone = zone_of(name);
            nodes
                .items
                .iter()
                .any(|n| n.name_any() != name && open(n) && n.labels().get(ZONE) == zone.as_ref())
        };
        let mut candidates: Vec<String> = list
            .items
            .iter()
            .filter(|p| p.name_any().starts_with("postgres-"))
            .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
            .filter(|n| has_sibling(n))
            .collect();
        candidates.sort();
        candidates
            .into_iter()
            .next()
            .expect("a node runs a postgres pod and shares its zone with another open node")
    }

    /// Sets the quickstart postgres PDB to `maxUnavailable: 0`, so every postgres eviction is refused
    /// with 429 and a plan waits in Draining.
    pub async fn block_postgres_evictions(&self) {
        use k8s_openapi::api::policy::v1::PodDisruptionBudget;
        use kube::api::{Patch, PatchParams};
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), "shop");
        let pdb = pdbs
            .list(&Default::default())
            .await
            .expect("list PDBs")
            .items
            .into_iter()
            .find(|p| p.name_any().contains("postgres"))
            .expect("the quickstart scenario has a postgres PDB");
        pdbs.patch(
            &pdb.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxUnavailable": 0}})),
        )
        .await
        .expect("patch the postgres PDB");
    }

    /// The protected pods on `node` (`ns/name`) → their PVC claims, by the oracle's own rule.
    pub async fn protected_pods_on(&self, node: &str) -> BTreeMap<String, BTreeSet<String>> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
        let pods: Vec<Value> = pods
            .list(&lp)
            .await
            .expect("list pods")
            .items
            .iter()
            .map(|p| serde_json::to_value(p).expect("a pod serializes"))
            .collect();
        crate::safety::protected_pods(&pods)
    }

    pub async fn create_plan(&self, name: &str, spec: Value) -> DisruptionPlan {
        let plans: Api<DisruptionPlan> = Api::all(self.client.clone());
        let plan: DisruptionPlan = serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": name}, "spec": spec
        }))
        .expect("plan JSON");
        plans
            .create(&PostParams::default(), &plan)
            .await
            .expect("create plan")
    }

    /// Waits (by watch) until the plan's phase satisfies `want`, returning the plan.
    pub async fn wait_plan(
        &self,
        name: &str,
        timeout: Duration,
        want: impl Fn(PlanPhase) -> bool,
    ) -> DisruptionPlan {
        self.wait_plan_until(name, timeout, |p| {
            want(p.status.as_ref().map(|s| s.phase).unwrap_or_default())
        })
        .await
    }

    /// Watches plan `name` until `want` holds for it.
    pub async fn wait_plan_until(
        &self,
        name: &str,
        timeout: Duration,
        want: impl Fn(&DisruptionPlan) -> bool,
    ) -> DisruptionPlan {
        let plans: Api<DisruptionPlan> = Api::all(self.client.clone());
        let wc = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(plans, wc).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = None;
        while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, stream.next()).await {
            if let Ok(p) = ev {
                if want(&p) {
                    return p;
                }
                last = Some(p);
            }
        }
        panic!(
            "plan {name} did not reach the wanted state within {timeout:?}; last seen: {:#?}",
            last.and_then(|p| p.status)
        );
    }

    /// Watches every object of `api` (through a reflector) until `want` holds for them all together;
    /// panics naming `what` after [`TIMEOUT`].
    pub async fn wait_all<K>(&self, api: Api<K>, what: &str, want: impl Fn(&[K]) -> bool) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + k8s_openapi::serde::de::DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        self.wait_all_within(api, what, TIMEOUT, want).await
    }

    /// [`Harness::wait_all`] with its own time limit.
    pub async fn wait_all_within<K>(
        &self,
        api: Api<K>,
        what: &str,
        limit: Duration,
        want: impl Fn(&[K]) -> bool,
    ) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + k8s_openapi::serde::de::DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        let (store, writer) = kube::runtime::reflector::store();
        let stream =
            kube::runtime::reflector::reflector(writer, watcher(api, watcher::Config::default()))
                .default_backoff();
        let mut stream = std::pin::pin!(stream);
        let deadline = tokio::time::Instant::now() + limit;
        let mut listed = false;
        loop {
            let now: Vec<K> = store.state().iter().map(|o| (**o).clone()).collect();
            if listed && want(&now) {
                return now;
            }
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(Ok(watcher::Event::InitDone))) => listed = true,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    panic!("{what}: not reached within {limit:?}; last seen: {now:#?}")
                }
            }
        }
    }

    /// The plans whose spec names `node`.
    pub async fn plans_for(&self, node: &str) -> Vec<DisruptionPlan> {
        let plans: Api<DisruptionPlan> = Api::all(self.client.clone());
        plans
            .list(&Default::default())
            .await
            .expect("list plans")
            .items
            .into_iter()
            .filter(|p| p.spec.nodes.iter().any(|n| n == node))
            .collect()
    }

    pub async fn wait_phase(&self, name: &str, phase: PlanPhase) -> DisruptionPlan {
        self.wait_plan(name, TIMEOUT, |p| p == phase || p.is_terminal())
            .await
    }

    pub fn audit(&self) -> Vec<AuditEntry> {
        self.cluster.audit.since(0)
    }

    pub async fn node(&self, name: &str) -> Option<Node> {
        Api::<Node>::all(self.client.clone())
            .get_opt(name)
            .await
            .expect("get node")
    }

    /// The NodeClaim that owns Karpenter node `node` (panics when the node is gone or not Karpenter's).
    pub async fn nodeclaim_of(&self, node: &str) -> String {
        self.node(node)
            .await
            .expect("the node exists")
            .owner_references()
            .iter()
            .find(|o| o.kind == "NodeClaim")
            .map(|o| o.name.clone())
            .expect("a Karpenter node (owned by a NodeClaim)")
    }

    /// Eviction requests the API server accepted (201), as `ns/name` with their audit time.
    pub fn accepted_evictions(&self) -> Vec<(String, String)> {
        crate::safety::accepted_evictions(&self.audit())
            .into_iter()
            .map(|e| (e.pod, e.time))
            .collect()
    }
}

/// The promise, checked from the outside by the safety oracle: every eviction or DELETE of a protected pod
/// the API server accepted came after a verified backup of the plan covering all of that pod's PVCs.
pub fn assert_no_eviction_before_verified_backup(
    audit: &[AuditEntry],
    protected: &BTreeMap<String, BTreeSet<String>>,
    plan: &DisruptionPlan,
) {
    let plan = serde_json::to_value(plan).expect("a plan serializes");
    let backups = crate::safety::recorded_backups(&plan);
    let violations = crate::safety::eviction_violations(
        &crate::safety::pods_removed(audit),
        protected,
        &backups,
    );
    assert!(
        violations.is_empty(),
        "the promise was broken:\n{}\nbackup records: {backups:#?}",
        violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

impl Harness {
    /// What the storage itself holds for `plan`'s releases at a snapshot: the simulated EC2's snapshots
    /// and the simulated CSI driver's cuts (the world's own state, not the plan's status), each claim's EBS
    /// volume from the cluster's PVs, and whether the plan's spec asks for the release at the CSI
    /// snapshot.
    pub async fn ebs_evidence(&self, plan: &DisruptionPlan) -> crate::safety::EbsEvidence {
        let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(self.client.clone());
        let pvs: Vec<Value> = pvs
            .list(&Default::default())
            .await
            .expect("list PVs")
            .items
            .iter()
            .map(|pv| serde_json::to_value(pv).expect("a PV serializes"))
            .collect();
        let json = serde_json::to_value(plan).expect("a plan serializes");
        crate::safety::EbsEvidence {
            claim_volumes: crate::safety::ebs_claim_volumes(&pvs),
            snapshots: crate::safety::Ec2Snapshot::all_of(&self.cluster),
            plan_uids: plan.metadata.uid.iter().cloned().collect(),
            csi_cuts: crate::safety::csi_cuts_of(&self.cluster),
            snapshot_release_uids: crate::safety::snapshot_release_uid(&json)
                .into_iter()
                .collect(),
            pod_starts: crate::safety::pod_starts(&self.audit()),
        }
    }

    /// The promise with the emergency path: every protected pod removed came after a verified backup of
    /// each claim, or (EBS claims) after EC2 started a snapshot of its volume tagged with the plan's uid.
    pub async fn assert_no_eviction_before_saved(
        &self,
        protected: &BTreeMap<String, BTreeSet<String>>,
        plan: &DisruptionPlan,
    ) {
        let evidence = self.ebs_evidence(plan).await;
        let json = serde_json::to_value(plan).expect("a plan serializes");
        let backups = crate::safety::recorded_backups(&json);
        let violations = crate::safety::eviction_violations_with_snapshots(
            &crate::safety::pods_removed(&self.audit()),
            protected,
            &backups,
            &evidence,
        );
        assert!(
            violations.is_empty(),
            "the promise was broken:\n{}\nbackup records: {backups:#?}\nEC2: {evidence:#?}",
            violations
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Installs snapdrain's CRDs (DisruptionPlan, DisruptionPolicy) through the API, as `kubectl apply -f crds/` would. An existing CRD
/// (a second demo against the same cluster) is fine.
pub async fn install_plan_crd(client: &Client) -> Result<(), kube::Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        DisruptionPlan::crd(),
        snapdrain::api::DisruptionPolicy::crd(),
    ] {
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The plan spec used by most tests: one node, replacement after the drain, launched as the replaced
/// instance was (its AMI, subnet, instance profile and security groups), which the default
/// DisruptionPolicy allows.
pub fn replacing_spec(node: &str) -> Value {
    json!({
        "nodes": [node],
        "replacement": {
            "when": "after-drain",
            "instanceTypes": ["m6i.xlarge"],
        }
    })
}

impl Harness {
    /// Velero Backups this plan created, by name.
    pub async fn backups_of(&self, plan: &str) -> Vec<String> {
        let api: Api<snapdrain::api::velero::Backup> =
            Api::namespaced(self.client.clone(), "velero");
        let lp = kube::api::ListParams::default().labels(&format!("snapdrain.io/plan={plan}"));
        let mut names: Vec<String> = api
            .list(&lp)
            .await
            .expect("list backups")
            .items
            .iter()
            .map(|b| b.name_any())
            .collect();
        names.sort();
        names
    }

    /// Instances snapdrain launched for this plan (tagged `snapdrain.io/plan`).
    pub fn instances_of(&self, plan: &str) -> Vec<String> {
        self.cluster
            .ec2
            .as_ref()
            .expect("ec2")
            .instances()
            .into_iter()
            .filter(|i| i.info.tags.get("snapdrain.io/plan").map(String::as_str) == Some(plan))
            .map(|i| i.info.id)
            .collect()
    }

    /// Waits (by watch) until the Velero Backup of this plan reaches `phase`; returns its name.
    pub async fn wait_backup_phase(&self, plan: &str, phase: &str) -> String {
        let api: Api<snapdrain::api::velero::Backup> =
            Api::namespaced(self.client.clone(), "velero");
        let wc = watcher::Config::default().labels(&format!("snapdrain.io/plan={plan}"));
        let stream = watcher(api, wc).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, stream.next()).await {
            if let Ok(b) = ev
                && b.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)
            {
                return b.name_any();
            }
        }
        panic!("no Backup of plan {plan} reached {phase} within {TIMEOUT:?}");
    }

    /// Status writes the API server accepted for this plan.
    pub fn status_writes(&self, plan: &str) -> usize {
        self.audit()
            .iter()
            .filter(|e| {
                e.resource == "disruptionplans.snapdrain.io/status"
                    && e.name.as_deref() == Some(plan)
                    && e.code == Some(200)
            })
            .count()
    }
}
