//! The simulated Velero server driven from outside: Backups created with kube-rs, objects read back
//! from the bucket with aws-sdk-s3, ordering checked in the audit log.
//!
//! Until `sim::s3::S3Sim` is on this branch, a minimal s3s-fs endpoint is started here.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_credential_types::Credentials;
use base64::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::apiserver::store::{DeleteOptions, WriteOptions};
use snapdrain_sim::cluster::load_object;
use snapdrain_sim::world::velero::{
    self, DataPath, RESTART_FAILURE, VeleroConfig, VeleroFault, VeleroHandle,
};
use snapdrain_sim::world::{Timings, WorldContext};
use snapdrain_sim::{SimCluster, SimConfig, manifests};

const ACCESS: &str = "minio";
const SECRET: &str = "minio123";

/// An S3 endpoint (s3s-fs on loopback) with an outage switch.
struct TestS3 {
    endpoint: String,
    outage: Arc<AtomicBool>,
    _dir: tempfile::TempDir,
}

impl TestS3 {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("velero")).unwrap();
        let fs = s3s_fs::FileSystem::new(dir.path()).unwrap();
        let mut builder = s3s::service::S3ServiceBuilder::new(fs);
        builder.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS, SECRET));
        let service = builder.build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let outage = Arc::new(AtomicBool::new(false));
        let down = outage.clone();
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let service = service.clone();
                let down = down.clone();
                let svc = hyper::service::service_fn(
                    move |req: http::Request<hyper::body::Incoming>| {
                        let service = service.clone();
                        let is_down = down.load(Ordering::SeqCst);
                        async move {
                            if is_down {
                                let mut r = http::Response::new(s3s::Body::from(
                                "<Error><Code>ServiceUnavailable</Code><Message>down</Message></Error>".to_string(),
                            ));
                                *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                                return Ok(r);
                            }
                            service.call(req.map(s3s::Body::from)).await
                        }
                    },
                );
                tokio::spawn(
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(socket), svc)
                        .into_owned(),
                );
            }
        });
        Self {
            endpoint: format!("http://{addr}"),
            outage,
            _dir: dir,
        }
    }

    fn client(&self) -> aws_sdk_s3::Client {
        let conf = aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new("minio"))
            .endpoint_url(&self.endpoint)
            .credentials_provider(Credentials::new(ACCESS, SECRET, None, None, "test"))
            .force_path_style(true)
            .build();
        aws_sdk_s3::Client::from_conf(conf)
    }

    async fn get(&self, key: &str) -> Option<Vec<u8>> {
        let out = self
            .client()
            .get_object()
            .bucket("velero")
            .key(key)
            .send()
            .await
            .ok()?;
        Some(out.body.collect().await.ok()?.into_bytes().to_vec())
    }

    async fn keys(&self, prefix: &str) -> Vec<String> {
        let out = self
            .client()
            .list_objects_v2()
            .bucket("velero")
            .prefix(prefix)
            .send()
            .await
            .unwrap();
        out.contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_string))
            .collect()
    }
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn crd_objects() -> Vec<Value> {
    let dirs = [
        concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/crds/velero"),
        "/work/shared/fixtures/crds/velero",
    ];
    let dir = dirs
        .iter()
        .find(|d| std::path::Path::new(d).is_dir())
        .expect("velero CRD fixtures");
    let mut out = Vec::new();
    for f in [
        "velero.io_backups.yaml",
        "velero.io_backupstoragelocations.yaml",
        "velero.io_podvolumebackups.yaml",
    ] {
        let text = std::fs::read_to_string(format!("{dir}/{f}")).unwrap();
        out.extend(manifests::parse_objects(&text, f).unwrap());
    }
    // Not among the shared fixtures: the copy the sim embeds (velero config/crd/v1/bases).
    out.extend(
        manifests::parse_objects(
            include_str!(
                "../../../snapdrain-sim/src/scenario/crds/velero.io_deletebackuprequests.yaml"
            ),
            "velero.io_deletebackuprequests.yaml",
        )
        .unwrap(),
    );
    out
}

/// The Velero server Deployment as `velero install` writes it (pkg/install/deployment.go): the
/// credentials Secret mounted at /credentials and `AWS_SHARED_CREDENTIALS_FILE` pointing into it; without
/// a Secret (`--no-secret`, IRSA) neither.
fn velero_deployment(secret: Option<&str>) -> Value {
    let mut container = json!({"name": "velero", "image": "velero/velero:v1.18.2",
                               "env": [{"name": "VELERO_NAMESPACE", "value": "velero"}]});
    let mut volumes = json!([]);
    if let Some(s) = secret {
        container["env"] = json!([{"name": "VELERO_NAMESPACE", "value": "velero"},
                                  {"name": "AWS_SHARED_CREDENTIALS_FILE", "value": "/credentials/cloud"}]);
        container["volumeMounts"] =
            json!([{"name": "cloud-credentials", "mountPath": "/credentials"}]);
        volumes = json!([{"name": "cloud-credentials", "secret": {"secretName": s}}]);
    }
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "velero", "namespace": "velero"},
           "spec": {"replicas": 0, "selector": {"matchLabels": {"deploy": "velero"}},
                    "template": {"metadata": {"labels": {"deploy": "velero"}},
                                 "spec": {"containers": [container], "volumes": volumes}}}})
}

struct Env {
    cluster: SimCluster,
    ctx: Arc<WorldContext>,
    s3: TestS3,
    velero: VeleroHandle,
    client: kube::Client,
}

const INTERNAL: WriteOptions = WriteOptions {
    dry_run: false,
    internal: true,
};

impl Env {
    async fn start(timings: Timings, concurrent: usize) -> Self {
        let s3 = TestS3::start().await;
        let creds =
            format!("[default]\naws_access_key_id = {ACCESS}\naws_secret_access_key = {SECRET}\n");
        let mut objects = crd_objects();
        objects.extend([
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "velero"}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "db"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cloud-credentials", "namespace": "velero"},
                   "data": {"cloud": base64::engine::general_purpose::STANDARD.encode(creds)}}),
            json!({"apiVersion": "velero.io/v1", "kind": "BackupStorageLocation",
                   "metadata": {"name": "default", "namespace": "velero"},
                   "spec": {"provider": "aws", "default": true, "accessMode": "ReadWrite",
                            "objectStorage": {"bucket": "velero", "prefix": "cluster-a"},
                            "config": {"region": "minio", "s3ForcePathStyle": "true", "s3Url": s3.endpoint}}}),
            velero_deployment(Some("cloud-credentials")),
        ]);
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
            timings,
        ));
        let velero = VeleroHandle::new();
        // No kubelet runs here (pods are written as it would): the ≤ 1.16 data path, inside the
        // node-agent. The 1.17+ hosting pods are tested with the world in velero_datapath.rs.
        let config = VeleroConfig {
            concurrent_backups: concurrent,
            data_path: DataPath::NodeAgent,
            ..Default::default()
        };
        tokio::spawn(velero::run(ctx.clone(), config, velero.clone()));
        let client =
            kube::Client::try_from(cluster.kube_config()).expect("a client for the simulator");
        let env = Self {
            cluster,
            ctx,
            s3,
            velero,
            client,
        };
        for node in ["node-a", "node-b"] {
            env.pod(
                "velero",
                &format!("node-agent-{node}"),
                node,
                json!({"name": "node-agent"}),
                json!([]),
                json!({}),
            );
        }
        env
    }

    fn create(&self, obj: Value) {
        load_object(&self.ctx.store, obj).unwrap();
    }

    /// A running pod written as the kubelet would (status included).
    fn pod(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        labels: Value,
        volumes: Value,
        annotations: Value,
    ) {
        self.ctx
            .store
            .create(
                &ResKey::core("pods"),
                Some(ns),
                json!({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
                       "spec": {"nodeName": node, "containers": [{"name": "c", "image": "postgres:16"}], "volumes": volumes},
                       "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
                INTERNAL,
            )
            .unwrap();
    }

    /// A StatefulSet-like replica `pg-<i>` on `node` with PVC `data-pg-<i>` bound to a PV.
    fn replica(&self, i: usize, node: &str, size: &str) {
        let pvc = format!("data-pg-{i}");
        let pv = format!("pvc-{i:04}");
        self.create(json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Delete",
                     "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": format!("vol-{i}")}}}));
        self.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": pvc, "namespace": "db", "labels": {"app": "pg"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv, "resources": {"requests": {"storage": size}}},
            "status": {"phase": "Bound", "capacity": {"storage": size}}}));
        self.pod(
            "db",
            &format!("pg-{i}"),
            node,
            json!({"app": "pg"}),
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": pvc}}]),
            json!({}),
        );
    }

    /// A DeleteBackupRequest as `velero backup delete` creates it, through the API.
    async fn request_delete(&self, name: &str, backup: &str) {
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            "velero",
            &kube::api::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("velero.io", "v1", "DeleteBackupRequest"),
                "deletebackuprequests",
            ),
        );
        let obj: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "velero.io/v1", "kind": "DeleteBackupRequest",
            "metadata": {"name": name, "namespace": "velero", "labels": {"velero.io/backup-name": backup}},
            "spec": {"backupName": backup}
        }))
        .unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
    }

    fn exists(&self, name: &str) -> bool {
        self.ctx
            .store
            .get(&ResKey::new("velero.io", "backups"), Some("velero"), name)
            .is_some()
    }

    /// The `status.errors` the deletion controller recorded when it processed request `dbr`.
    fn processed(&self, dbr: &str) -> Option<Vec<String>> {
        self.ctx.audit.since(0).into_iter().find_map(|e| {
            (e.resource == "deletebackuprequests.velero.io"
                && e.name.as_deref() == Some(dbr)
                && e.detail["phase"] == "Processed")
                .then(|| {
                    e.detail["errors"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|v| v.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default()
                })
        })
    }

    fn phases_of(&self, name: &str) -> Vec<String> {
        self.ctx
            .audit
            .since(0)
            .into_iter()
            .filter(|e| e.resource == "backups.velero.io" && e.name.as_deref() == Some(name))
            .filter_map(|e| e.detail["phase"].as_str().map(str::to_string))
            .collect()
    }

    async fn create_backup(&self, name: &str, spec: Value) -> Value {
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            "velero",
            &kube::api::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("velero.io", "v1", "Backup"),
                "backups",
            ),
        );
        let obj: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "velero.io/v1", "kind": "Backup", "metadata": {"name": name, "namespace": "velero"}, "spec": spec
        }))
        .unwrap();
        serde_json::to_value(api.create(&PostParams::default(), &obj).await.unwrap()).unwrap()
    }

    fn backup(&self, name: &str) -> Value {
        (*self
            .ctx
            .store
            .get(&ResKey::new("velero.io", "backups"), Some("velero"), name)
            .unwrap())
        .clone()
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

    async fn wait_phase(&self, name: &str, phases: &[&str]) -> Value {
        self.wait_for(&format!("backup {name} in {phases:?}"), |e| {
            phases.contains(
                &e.backup(name)
                    .pointer("/status/phase")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
            )
        })
        .await;
        self.backup(name)
    }
}

fn fs_spec() -> Value {
    json!({"includedNamespaces": ["db"], "labelSelector": {"matchLabels": {"app": "pg"}}, "defaultVolumesToFsBackup": true, "ttl": "168h0m0s"})
}

#[tokio::test]
async fn backup_completes_and_writes_the_real_bucket_layout() {
    let env = Env::start(Timings::default(), 1).await;
    env.replica(0, "node-a", "1Gi");
    env.replica(1, "node-b", "2Gi");
    env.pod(
        "db",
        "other",
        "node-a",
        json!({"app": "other"}),
        json!([]),
        json!({}),
    );
    let created = env.create_backup("b1", fs_spec()).await;
    let done = env
        .wait_phase(
            "b1",
            &["Completed", "PartiallyFailed", "Failed", "FailedValidation"],
        )
        .await;
    assert_eq!(done["status"]["phase"], "Completed", "{done:#}");
    assert_eq!(done["status"]["formatVersion"], "1.1.0");
    assert_eq!(done["status"]["version"], 1);
    assert!(
        done["status"]["startTimestamp"].is_string()
            && done["status"]["completionTimestamp"].is_string()
    );
    let start = done["status"]["startTimestamp"]
        .as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap();
    let exp = done["status"]["expiration"]
        .as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap();
    assert_eq!(exp.as_second() - start.as_second(), 168 * 3600);
    assert_eq!(
        done["metadata"]["labels"]["velero.io/storage-location"],
        "default"
    );

    let base = "cluster-a/backups/b1/";
    let meta: Value = serde_json::from_slice(
        &env.s3
            .get(&format!("{base}velero-backup.json"))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(meta["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(meta["status"]["phase"], "Completed");
    let tar = env.s3.get(&format!("{base}b1.tar.gz")).await.unwrap();
    let raw = gunzip(&tar);
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.contains("resources/pods/namespaces/db/pg-0.json"),
        "tarball lists the covered pod"
    );
    assert!(text.contains("persistentvolumeclaims/namespaces/db/data-pg-1.json"));
    assert!(
        !text.contains("namespaces/db/other.json"),
        "the label selector excludes other pods"
    );

    let infos: Value = serde_json::from_slice(&gunzip(
        &env.s3
            .get(&format!("{base}b1-volumeinfo.json.gz"))
            .await
            .unwrap(),
    ))
    .unwrap();
    let infos = infos.as_array().unwrap();
    let mut pvcs: Vec<&str> = infos
        .iter()
        .map(|i| i["pvcName"].as_str().unwrap())
        .collect();
    pvcs.sort();
    assert_eq!(pvcs, ["data-pg-0", "data-pg-1"]);
    for i in infos {
        assert_eq!(i["result"], "succeeded", "{i}");
        assert_eq!(i["backupMethod"], "PodVolumeBackup");
        assert_eq!(i["skipped"], false);
        assert_eq!(i["pvbInfo"]["snapshotHandle"].as_str().unwrap().len(), 32);
    }
    let pvbs: Value = serde_json::from_slice(&gunzip(
        &env.s3
            .get(&format!("{base}b1-podvolumebackups.json.gz"))
            .await
            .unwrap(),
    ))
    .unwrap();
    assert!(
        pvbs.as_array()
            .unwrap()
            .iter()
            .all(|p| p["status"]["phase"] == "Completed")
    );
    let list: Value = serde_json::from_slice(&gunzip(
        &env.s3
            .get(&format!("{base}b1-resource-list.json.gz"))
            .await
            .unwrap(),
    ))
    .unwrap();
    assert!(
        list["v1/Pod"]
            .as_array()
            .unwrap()
            .contains(&json!("db/pg-0"))
    );
    for f in ["b1-logs.gz", "b1-results.gz"] {
        assert!(env.s3.get(&format!("{base}{f}")).await.is_some(), "{f}");
    }
    let kopia = env.s3.keys("cluster-a/kopia/db/").await;
    assert!(kopia.contains(&"cluster-a/kopia/db/kopia.repository".to_string()));
    assert_eq!(
        kopia
            .iter()
            .filter(|k| k.starts_with("cluster-a/kopia/db/p"))
            .count(),
        2
    );
    // Nothing outside Velero's own top-level directories.
    for k in env.s3.keys("cluster-a/").await {
        let top = k
            .trim_start_matches("cluster-a/")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        assert!(["backups", "kopia"].contains(&top.as_str()), "{k}");
    }
    // PodVolumeBackup CRs carry Velero's labels.
    let (pvb_objs, _) = env
        .ctx
        .store
        .snapshot(&ResKey::new("velero.io", "podvolumebackups"));
    assert_eq!(pvb_objs.len(), 2);
    assert!(
        pvb_objs
            .iter()
            .all(
                |p| p["metadata"]["labels"]["velero.io/backup-uid"] == created["metadata"]["uid"]
                    && p["metadata"]["labels"]["velero.io/pvc-uid"].is_string()
            )
    );

    // The bucket said Completed before the CR did.
    let log = env.ctx.audit.since(0);
    let put = log
        .iter()
        .find(|e| {
            e.verb == "s3-put"
                && e.name.as_deref() == Some("cluster-a/backups/b1/velero-backup.json")
                && e.detail["phase"] == "Completed"
        })
        .expect("final JSON upload");
    let phase = log
        .iter()
        .find(|e| {
            e.verb == "phase" && e.name.as_deref() == Some("b1") && e.detail["phase"] == "Completed"
        })
        .expect("Completed phase");
    assert!(put.seq < phase.seq);
    assert_eq!(
        phase.detail["pvcs"],
        json!(["db/data-pg-0", "db/data-pg-1"])
    );
    let phases: Vec<&str> = log
        .iter()
        .filter(|e| e.verb == "phase" && e.name.as_deref() == Some("b1"))
        .map(|e| e.detail["phase"].as_str().unwrap())
        .collect();
    assert_eq!(
        phases,
        [
            "Queued",
            "ReadyToStart",
            "InProgress",
            "Finalizing",
            "Completed"
        ]
    );
    // The BSL was validated.
    env.wait_for("BSL Available", |e| {
        e.ctx
            .store
            .get(
                &ResKey::new("velero.io", "backupstoragelocations"),
                Some("velero"),
                "default",
            )
            .unwrap()["status"]["phase"]
            == "Available"
    })
    .await;
}

#[tokio::test]
async fn second_backup_waits_queued_while_the_first_runs() {
    let timings = Timings {
        backup_overhead: Duration::from_millis(1500),
        ..Timings::default()
    };
    let env = Env::start(timings, 1).await;
    env.replica(0, "node-a", "1Gi");
    env.create_backup("first", fs_spec()).await;
    env.wait_phase("first", &["InProgress"]).await;
    env.create_backup("second", fs_spec()).await;
    let second = env.wait_phase("second", &["Queued"]).await;
    assert_eq!(second["status"]["queuePosition"], 1);
    assert_eq!(env.backup("first")["status"]["phase"], "InProgress");
    env.wait_phase("first", &["Completed"]).await;
    let second = env.wait_phase("second", &["Completed"]).await;
    assert!(second["status"].get("queuePosition").is_none());
}

#[tokio::test]
async fn injected_faults_fail_backups_as_velero_reports_them() {
    let env = Env::start(Timings::default(), 1).await;
    env.replica(0, "node-a", "1Gi");
    env.replica(1, "node-b", "1Gi");
    env.velero.inject(VeleroFault::FailNextBackup {
        reason: "rpc error: code = Unavailable".into(),
    });
    env.create_backup("f1", fs_spec()).await;
    let f1 = env
        .wait_phase("f1", &["Completed", "PartiallyFailed", "Failed"])
        .await;
    assert_eq!(f1["status"]["phase"], "Failed");
    assert_eq!(
        f1["status"]["failureReason"],
        "rpc error: code = Unavailable"
    );
    // A Failed backup is still persisted, with phase Failed: files alone prove nothing.
    let meta: Value = serde_json::from_slice(
        &env.s3
            .get("cluster-a/backups/f1/velero-backup.json")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(meta["status"]["phase"], "Failed");

    env.velero.inject(VeleroFault::FailVolume {
        namespace: "db".into(),
        pvc: "data-pg-1".into(),
    });
    env.create_backup("f2", fs_spec()).await;
    let f2 = env
        .wait_phase("f2", &["Completed", "PartiallyFailed", "Failed"])
        .await;
    assert_eq!(f2["status"]["phase"], "PartiallyFailed");
    assert_eq!(f2["status"]["errors"], 1);
    let infos: Value = serde_json::from_slice(&gunzip(
        &env.s3
            .get("cluster-a/backups/f2/f2-volumeinfo.json.gz")
            .await
            .unwrap(),
    ))
    .unwrap();
    let bad = infos
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["pvcName"] == "data-pg-1")
        .unwrap();
    assert_eq!(bad["result"], "failed");
}

#[tokio::test]
async fn validation_failures_never_run() {
    let env = Env::start(Timings::default(), 1).await;
    let mut both = fs_spec();
    both["orLabelSelectors"] = json!([{"matchLabels": {"app": "x"}}]);
    env.create_backup("both", both).await;
    let b = env
        .wait_phase("both", &["FailedValidation", "Completed"])
        .await;
    assert_eq!(b["status"]["phase"], "FailedValidation");
    assert!(
        b["status"]["validationErrors"][0]
            .as_str()
            .unwrap()
            .contains("only one can be specified")
    );
    let mut loc = fs_spec();
    loc["storageLocation"] = json!("nope");
    env.create_backup("loc", loc).await;
    let l = env
        .wait_phase("loc", &["FailedValidation", "Completed"])
        .await;
    assert!(
        l["status"]["validationErrors"][0]
            .as_str()
            .unwrap()
            .contains("\"nope\" not found")
    );
}

#[tokio::test]
async fn restart_fails_in_progress_backups_with_velero_message() {
    let timings = Timings {
        backup_overhead: Duration::from_secs(30),
        ..Timings::default()
    };
    let env = Env::start(timings, 1).await;
    env.replica(0, "node-a", "1Gi");
    env.create_backup("r1", fs_spec()).await;
    env.wait_phase("r1", &["InProgress"]).await;
    env.velero.restart();
    let r1 = env.wait_phase("r1", &["Failed", "Completed"]).await;
    assert_eq!(r1["status"]["phase"], "Failed");
    assert_eq!(r1["status"]["failureReason"], RESTART_FAILURE);
    assert!(RESTART_FAILURE.contains("during the server starting"));
}

#[tokio::test]
async fn covered_pod_or_node_agent_leaving_mid_backup_fails_it() {
    let timings = Timings {
        backup_overhead: Duration::from_millis(1500),
        ..Timings::default()
    };
    let env = Env::start(timings, 1).await;
    env.replica(0, "node-a", "1Gi");
    env.replica(1, "node-b", "1Gi");
    env.create_backup("d1", fs_spec()).await;
    env.wait_phase("d1", &["InProgress"]).await;
    let pods = ResKey::core("pods");
    env.ctx
        .store
        .delete(&pods, Some("db"), "pg-0", &DeleteOptions::default())
        .unwrap();
    let now = DeleteOptions {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    env.ctx
        .store
        .delete(&pods, Some("velero"), "node-agent-node-b", &now)
        .unwrap();
    let d1 = env
        .wait_phase("d1", &["Completed", "PartiallyFailed", "Failed"])
        .await;
    assert_eq!(d1["status"]["phase"], "PartiallyFailed");
    assert_eq!(d1["status"]["errors"], 2);
    let (pvbs, _) = env
        .ctx
        .store
        .snapshot(&ResKey::new("velero.io", "podvolumebackups"));
    let message = |pod: &str| {
        let p = pvbs
            .iter()
            .find(|p| p["spec"]["pod"]["name"] == pod)
            .unwrap();
        assert_eq!(p["status"]["phase"], "Failed");
        p["status"]["message"].as_str().unwrap().to_string()
    };
    assert!(message("pg-0").contains("went away"));
    assert!(message("pg-1").contains("node-agent on node node-b"));
}

/// Adds a fault rule through the simulator's control surface.
async fn post_fault(env: &Env, rule: Value) {
    let r = snapdrain_testkit::raw_client(env.cluster.ca_pem())
        .post(format!("{}/sim/faults", env.cluster.url()))
        .json(&rule)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

/// `{"kind": "velero", "restart": "server"}` restarts the server as `restart()` does: the InProgress
/// backup fails with Velero's own reason (velero `pkg/cmd/server/server.go`); the rule is not kept.
#[tokio::test]
async fn a_velero_fault_rule_restarts_the_server() {
    let timings = Timings {
        backup_overhead: Duration::from_secs(30),
        ..Timings::default()
    };
    let env = Env::start(timings, 1).await;
    env.replica(0, "node-a", "1Gi");
    env.create_backup("r2", fs_spec()).await;
    env.wait_phase("r2", &["InProgress"]).await;
    post_fault(&env, json!({"kind": "velero", "restart": "server"})).await;
    let r2 = env.wait_phase("r2", &["Failed", "Completed"]).await;
    assert_eq!(r2["status"]["phase"], "Failed");
    assert_eq!(r2["status"]["failureReason"], RESTART_FAILURE);
    assert!(env.cluster.faults.rules().is_empty());
}

/// `{"kind": "velero", "restart": "node-agent", "node": ...}` deletes that node's node-agent pod: the
/// volume uploading there fails as a node-agent restart fails its InProgress PodVolumeBackups (velero
/// `pkg/cmd/cli/nodeagent/server.go`), the other node's volume is untouched.
#[tokio::test]
async fn a_velero_fault_rule_restarts_one_node_agent() {
    let timings = Timings {
        backup_overhead: Duration::from_millis(1500),
        ..Timings::default()
    };
    let env = Env::start(timings, 1).await;
    env.replica(0, "node-a", "1Gi");
    env.replica(1, "node-b", "1Gi");
    env.create_backup("d3", fs_spec()).await;
    env.wait_phase("d3", &["InProgress"]).await;
    post_fault(
        &env,
        json!({"kind": "velero", "restart": "node-agent", "node": "node-b"}),
    )
    .await;
    let d3 = env
        .wait_phase("d3", &["Completed", "PartiallyFailed", "Failed"])
        .await;
    assert_eq!(d3["status"]["phase"], "PartiallyFailed");
    assert_eq!(d3["status"]["errors"], 1);
    let (pvbs, _) = env
        .ctx
        .store
        .snapshot(&ResKey::new("velero.io", "podvolumebackups"));
    let on = |pod: &str| {
        pvbs.iter()
            .find(|p| p["spec"]["pod"]["name"] == pod)
            .unwrap()
            .clone()
    };
    assert_eq!(on("pg-0")["status"]["phase"], "Completed");
    assert_eq!(on("pg-1")["status"]["phase"], "Failed");
    assert!(
        on("pg-1")["status"]["message"]
            .as_str()
            .unwrap()
            .contains("node-agent on node node-b")
    );
}

#[tokio::test]
async fn missing_node_agent_fails_the_volume() {
    let env = Env::start(Timings::default(), 1).await;
    env.replica(0, "node-c", "1Gi");
    env.create_backup("n1", fs_spec()).await;
    let n1 = env
        .wait_phase("n1", &["Completed", "PartiallyFailed", "Failed"])
        .await;
    assert_eq!(n1["status"]["phase"], "PartiallyFailed");
    let results: Value = serde_json::from_slice(&gunzip(
        &env.s3
            .get("cluster-a/backups/n1/n1-results.gz")
            .await
            .unwrap(),
    ))
    .unwrap();
    assert!(
        results["errors"]["namespaces"]["db"][0]
            .as_str()
            .unwrap()
            .contains("daemonset pod not found in running state in node node-c")
    );
}

#[tokio::test]
async fn s3_outage_fails_the_backup_with_the_upload_error() {
    let env = Env::start(Timings::default(), 1).await;
    env.replica(0, "node-a", "1Gi");
    env.s3.outage.store(true, Ordering::SeqCst);
    env.create_backup("o1", json!({"includedNamespaces": ["db"]}))
        .await;
    let o1 = env
        .wait_phase("o1", &["Completed", "PartiallyFailed", "Failed"])
        .await;
    assert_eq!(o1["status"]["phase"], "Failed");
    assert!(
        o1["status"]["failureReason"]
            .as_str()
            .unwrap()
            .contains("error uploading"),
        "{o1:#}"
    );
    env.wait_for("BSL Unavailable", |e| {
        e.ctx
            .store
            .get(
                &ResKey::new("velero.io", "backupstoragelocations"),
                Some("velero"),
                "default",
            )
            .unwrap()["status"]["phase"]
            == "Unavailable"
    })
    .await;
    let _ = &env.cluster;
}

/// velero pkg/controller/backup_controller.go prepareBackupRequest: without spec.storageLocation the
/// BSL marked `spec.default: true` is used, whatever its name, and written into the stored spec; a named
/// BSL that does not exist fails validation with Velero's message.
#[tokio::test]
async fn backup_without_location_goes_to_the_bsl_marked_default() {
    let env = Env::start(Timings::default(), 1).await;
    env.replica(0, "node-a", "1Gi");
    let bsls = ResKey::new("velero.io", "backupstoragelocations");
    env.ctx
        .store
        .modify(&bsls, Some("velero"), "default", None, INTERNAL, |cur| {
            let mut v = cur.clone();
            v["spec"]["default"] = json!(false);
            Ok(v)
        })
        .unwrap();
    let mut aws = (*env.ctx.store.get(&bsls, Some("velero"), "default").unwrap()).clone();
    aws["metadata"] = json!({"name": "aws", "namespace": "velero"});
    aws["spec"]["default"] = json!(true);
    aws["spec"]["objectStorage"]["prefix"] = json!("cluster-aws");
    env.create(aws);
    let mut spec = fs_spec();
    spec.as_object_mut().unwrap().remove("storageLocation");
    env.create_backup("unnamed", spec).await;
    let b = env
        .wait_phase("unnamed", &["Completed", "Failed", "FailedValidation"])
        .await;
    assert_eq!(b["status"]["phase"], "Completed", "{b:#}");
    assert_eq!(b["spec"]["storageLocation"], "aws");
    assert_eq!(b["metadata"]["labels"]["velero.io/storage-location"], "aws");
    assert!(
        env.s3
            .get("cluster-aws/backups/unnamed/velero-backup.json")
            .await
            .is_some()
    );

    let mut named = fs_spec();
    named["storageLocation"] = json!("minio");
    env.create_backup("named", named).await;
    let n = env
        .wait_phase("named", &["Completed", "FailedValidation"])
        .await;
    assert_eq!(n["status"]["phase"], "FailedValidation");
    let msg = n["status"]["validationErrors"][0].as_str().unwrap();
    assert!(
        msg.contains("the default minio was not found")
            && msg.contains("backupstoragelocations.velero.io \"minio\" not found"),
        "{msg}"
    );
}

/// velero pkg/controller/backup_deletion_controller.go: a DeleteBackupRequest removes the bucket
/// directory and the Backup, ends Processed, and is refused ("backup is still in progress") while the
/// backup runs.
#[tokio::test]
async fn delete_backup_requests_remove_the_backup_and_its_bucket_data() {
    let env = Env::start(Timings::default(), 1).await;
    env.replica(0, "node-a", "1Gi");
    env.create_backup("done", fs_spec()).await;
    env.wait_phase("done", &["Completed"]).await;
    assert!(!env.s3.keys("cluster-a/backups/done/").await.is_empty());
    env.request_delete("done-1", "done").await;
    env.wait_for("the request processed", |e| e.processed("done-1").is_some())
        .await;
    assert_eq!(env.processed("done-1"), Some(vec![]));
    assert!(!env.exists("done"));
    assert!(env.s3.keys("cluster-a/backups/done/").await.is_empty());
    assert!(env.phases_of("done").contains(&"Deleting".to_string()));

    env.velero.inject(VeleroFault::HoldInProgress {
        backup: "running".into(),
    });
    env.create_backup("running", fs_spec()).await;
    env.wait_phase("running", &["InProgress"]).await;
    env.request_delete("running-1", "running").await;
    env.wait_for("the request processed", |e| {
        e.processed("running-1").is_some()
    })
    .await;
    assert_eq!(
        env.processed("running-1"),
        Some(vec!["backup is still in progress".to_string()])
    );
    env.velero.clear_faults();
    env.wait_phase("running", &["Completed"]).await;
}

/// velero pkg/controller/gc_controller.go: an expired Backup gets a DeleteBackupRequest and goes, with
/// its bucket data.
#[tokio::test]
async fn expired_backups_are_garbage_collected_with_their_bucket_data() {
    let env = Env::start(Timings::default(), 1).await;
    env.replica(0, "node-a", "1Gi");
    let mut spec = fs_spec();
    spec["ttl"] = json!("1s");
    env.create_backup("short", spec).await;
    env.create_backup("long", fs_spec()).await;
    env.wait_phase("long", &["Completed"]).await;
    env.wait_for("the expired backup collected", |e| !e.exists("short"))
        .await;
    assert!(env.s3.keys("cluster-a/backups/short/").await.is_empty());
    assert!(env.exists("long"));
    assert!(!env.s3.keys("cluster-a/backups/long/").await.is_empty());
}

/// velero pkg/controller/backup_queue_controller.go with --concurrent-backups 1: backups wait Queued
/// behind a running one. backup_deletion_controller.go deletes a Queued backup that names its location
/// (the backupTracker holds only running ones), but one without `spec.storageLocation` (resolved only when
/// it starts) is refused: it looks the BSL up by the empty name. Deleting that Backup object takes it out
/// of the queue; a deleted backup never runs and the next one does.
#[tokio::test]
async fn queued_backups_are_deleted_the_way_velero_allows_and_never_run() {
    let env = Env::start(Timings::default(), 1).await;
    env.replica(0, "node-a", "1Gi");
    env.velero.inject(VeleroFault::HoldInProgress {
        backup: "blocker".into(),
    });
    env.create_backup("blocker", fs_spec()).await;
    env.wait_phase("blocker", &["InProgress"]).await;

    let mut named = fs_spec();
    named["storageLocation"] = json!("default");
    env.create_backup("named", named).await;
    env.create_backup("unnamed", fs_spec()).await;
    env.wait_phase("named", &["Queued"]).await;
    env.wait_phase("unnamed", &["Queued"]).await;
    env.request_delete("named-1", "named").await;
    env.request_delete("unnamed-1", "unnamed").await;
    env.wait_for("both requests processed", |e| {
        e.processed("named-1").is_some() && e.processed("unnamed-1").is_some()
    })
    .await;
    assert_eq!(env.processed("named-1"), Some(vec![]));
    assert!(!env.exists("named"));
    assert_eq!(
        env.processed("unnamed-1"),
        Some(vec!["backup storage location  not found".to_string()])
    );
    assert_eq!(env.backup("unnamed")["status"]["phase"], "Queued");
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        "velero",
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("velero.io", "v1", "Backup"),
            "backups",
        ),
    );
    api.delete("unnamed", &Default::default()).await.unwrap();
    env.wait_for("the queued backup deleted", |e| !e.exists("unnamed"))
        .await;

    env.create_backup("retry", fs_spec()).await;
    env.wait_phase("retry", &["Queued"]).await;
    env.velero.clear_faults();
    env.wait_phase("retry", &["Completed"]).await;
    for gone in ["named", "unnamed"] {
        assert!(
            !env.phases_of(gone).contains(&"InProgress".to_string()),
            "{gone}: {:?}",
            env.phases_of(gone)
        );
    }
}

/// velero backup_finalizer_controller.go: FinalizingPartiallyFailed only ever ends PartiallyFailed.
#[tokio::test]
async fn a_held_finalizer_keeps_the_partially_failed_bound_phase() {
    let env = Env::start(Timings::default(), 1).await;
    env.replica(0, "node-a", "1Gi");
    env.velero.inject(VeleroFault::FailVolume {
        namespace: "db".into(),
        pvc: "data-pg-0".into(),
    });
    env.velero.inject(VeleroFault::HoldFinalizing);
    env.create_backup("pf", fs_spec()).await;
    env.wait_phase("pf", &["FinalizingPartiallyFailed"]).await;
    env.velero.clear_faults();
    let b = env
        .wait_phase("pf", &["PartiallyFailed", "Completed"])
        .await;
    assert_eq!(b["status"]["phase"], "PartiallyFailed");
}
