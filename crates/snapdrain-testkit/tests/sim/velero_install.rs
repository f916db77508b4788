//! The simulated Velero finds its object-store credentials, region and CA the way the real server does
//! on each kind of install, and writes its backups through the real aws-sdk-s3: `velero install`
//! (Secret `cloud-credentials`), the Helm chart (Secret named after the release), IRSA (no Secret, its
//! IAM role), AWS S3 without a region in the BSL, and MinIO over TLS with a private CA.

use std::time::Duration;

use serde_json::{Value, json};
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::apiserver::store::DeleteOptions;
use snapdrain_sim::cluster::load_object;
use snapdrain_sim::scenario::format::{VeleroCredentials, VeleroInstall, VeleroSpec};
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};
use snapdrain_testkit::{eventually_within, fast_timings};

async fn start(velero: impl FnOnce(&mut VeleroSpec)) -> SimCluster {
    let (mut scenario, label) = snapdrain_sim::scenario::resolve("quickstart").unwrap();
    velero(scenario.velero.as_mut().unwrap());
    SimCluster::start(SimConfig {
        scenario: Some(ScenarioSource::Inline {
            scenario: Box::new(scenario),
            label,
        }),
        timings: Some(fast_timings()),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Backs up namespace `shop` and returns the Backup's final phase and failure reason.
async fn backup(cluster: &SimCluster, name: &str) -> (String, Option<String>) {
    load_object(
        &cluster.store,
        json!({"apiVersion": "velero.io/v1", "kind": "Backup",
               "metadata": {"name": name, "namespace": "velero"},
               "spec": {"includedNamespaces": ["shop"], "storageLocation": "default",
                        "snapshotVolumes": false, "ttl": "1h0m0s"}}),
    )
    .unwrap();
    eventually_within("the backup ends", Duration::from_secs(30), || async {
        let b = cluster
            .store
            .get(&ResKey::new("velero.io", "backups"), Some("velero"), name)?;
        let phase = b.pointer("/status/phase").and_then(Value::as_str)?;
        matches!(phase, "Completed" | "PartiallyFailed" | "Failed").then(|| {
            (
                phase.to_string(),
                b.pointer("/status/failureReason")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            )
        })
    })
    .await
}

/// The key of a backup's `velero-backup.json` under the BSL's prefix.
fn metadata_key(cluster: &SimCluster, name: &str) -> String {
    let bsl = cluster
        .store
        .get(
            &ResKey::new("velero.io", "backupstoragelocations"),
            Some("velero"),
            "default",
        )
        .unwrap();
    match bsl
        .pointer("/spec/objectStorage/prefix")
        .and_then(Value::as_str)
    {
        Some(p) => format!("{p}/backups/{name}/velero-backup.json"),
        None => format!("backups/{name}/velero-backup.json"),
    }
}

/// The backup reached the bucket: it ended Completed, or PartiallyFailed when a volume was skipped
/// (the pods of this fresh world may still be starting), never Failed (which an unusable store gives).
async fn persisted(cluster: &SimCluster, name: &str) {
    let (phase, reason) = backup(cluster, name).await;
    assert!(
        matches!(phase.as_str(), "Completed" | "PartiallyFailed"),
        "{phase}: {reason:?}"
    );
    metadata_in_bucket(cluster, name).await;
}

async fn metadata_in_bucket(cluster: &SimCluster, name: &str) {
    let s3 = cluster.s3.as_ref().unwrap();
    s3.client()
        .head_object()
        .bucket("velero")
        .key(metadata_key(cluster, name))
        .send()
        .await
        .unwrap_or_else(|e| panic!("backup {name} is in the bucket: {e:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_reads_the_release_named_secret_through_the_deployment() {
    let cluster = start(|v| v.install = VeleroInstall::Helm).await;
    let secrets = ResKey::core("secrets");
    assert!(
        cluster
            .store
            .get(&secrets, Some("velero"), "velero")
            .is_some()
    );
    assert!(
        cluster
            .store
            .get(&secrets, Some("velero"), "cloud-credentials")
            .is_none()
    );
    persisted(&cluster, "helm-1").await;

    // Without the mounted Secret the server has no credentials file, and the location goes Unavailable.
    cluster
        .store
        .delete(
            &secrets,
            Some("velero"),
            "velero",
            &DeleteOptions::default(),
        )
        .unwrap();
    let message = eventually_within(
        "the BSL goes Unavailable",
        Duration::from_secs(10),
        || async {
            let bsl = cluster.store.get(
                &ResKey::new("velero.io", "backupstoragelocations"),
                Some("velero"),
                "default",
            )?;
            (bsl.pointer("/status/phase").and_then(Value::as_str) == Some("Unavailable"))
                .then(|| {
                    bsl.pointer("/status/message")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .flatten()
        },
    )
    .await;
    assert!(
        message.contains("secret velero/velero not found"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn irsa_install_uses_the_pods_role() {
    let cluster = start(|v| v.credentials = VeleroCredentials::Irsa).await;
    assert!(
        cluster
            .store
            .list(
                &ResKey::core("secrets"),
                Some("velero"),
                &|_| true,
                None,
                None
            )
            .items
            .is_empty(),
        "no credentials Secret with IRSA"
    );
    persisted(&cluster, "irsa-1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_s3_location_without_region_finds_the_bucket_region() {
    let cluster = start(|v| {
        v.aws_s3 = true;
        v.region = "eu-west-1".into();
    })
    .await;
    persisted(&cluster, "region-1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_location_trusts_its_ca_cert() {
    let cluster = start(|v| v.tls = true).await;
    let s3 = cluster.s3.as_ref().unwrap();
    assert!(s3.endpoint().starts_with("https://"));
    persisted(&cluster, "tls-1").await;
}

/// SSE-C: Velero writes with the mounted customer key; S3 then refuses a HEAD without it (400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_c_location_writes_with_the_customer_key() {
    let cluster = start(|v| v.sse_c = true).await;
    let (phase, reason) = backup(&cluster, "sse-1").await;
    assert!(phase != "Failed", "{phase}: {reason:?}");
    let s3 = cluster.s3.as_ref().unwrap().client();
    let key = metadata_key(&cluster, "sse-1");
    let err = s3
        .head_object()
        .bucket("velero")
        .key(&key)
        .send()
        .await
        .expect_err("an SSE-C object needs its key");
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(400));
    let k = b"0123456789abcdef0123456789abcdef";
    use base64::Engine as _;
    use md5::Digest as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    s3.head_object()
        .bucket("velero")
        .key(&key)
        .sse_customer_algorithm("AES256")
        .sse_customer_key(b64.encode(k))
        .sse_customer_key_md5(b64.encode(md5::Md5::digest(k)))
        .send()
        .await
        .unwrap();
}
