//! snapdrain reads Velero's bucket the way Velero does on real installs (review defects #3, #4, #5):
//! credentials from the Secret the Velero Deployment mounts (Helm names it after the release), or its
//! own IAM identity when Velero has none (IRSA); the bucket's region looked up with HeadBucket when the
//! BSL names none; TLS with the BSL's private CA, or without certificate verification when the BSL says
//! `insecureSkipTLSVerify`. Each plan must complete with its backups verified, and an endpoint certificate
//! the location's settings do not accept must fail the plan before anything is evicted.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;
use snapdrain::api::DisruptionPlan;
use snapdrain::api::status::PlanPhase;
use snapdrain_sim::scenario::format::{TlsCa, VeleroCredentials, VeleroInstall};
use snapdrain_testkit::harness::{Harness, TIMEOUT, assert_no_eviction_before_verified_backup};

/// Drains one node with a plan, then checks it completed with every backup verified and no protected pod
/// evicted before.
async fn drain_one(h: &Harness, name: &str) -> DisruptionPlan {
    let (protected, plan) = run_plan(h, name).await;
    assert_completed_and_verified(h, &protected, &plan);
    plan
}

/// Runs a plan for one node with StatefulSet pods until it ends; returns the node's protected pods and
/// the plan.
async fn run_plan(h: &Harness, name: &str) -> (BTreeMap<String, BTreeSet<String>>, DisruptionPlan) {
    let _controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    h.create_plan(name, json!({"nodes": [node]})).await;
    let plan = h.wait_plan(name, TIMEOUT, |p| p.is_terminal()).await;
    (protected, plan)
}

fn assert_completed_and_verified(
    h: &Harness,
    protected: &BTreeMap<String, BTreeSet<String>>,
    plan: &DisruptionPlan,
) {
    let status = plan.status.clone().expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    assert!(
        !status.backups.is_empty() && status.backups.iter().all(|b| b.verified),
        "every backup verified in the bucket: {:#?}",
        status.backups
    );
    assert_no_eviction_before_verified_backup(&h.audit(), protected, plan);
}

/// Helm chart install (vmware-tanzu/helm-charts `velero`, release `velero`): the credentials Secret is
/// `velero` (`_helpers.tpl` `velero.secretName`), mounted by the Deployment as volume
/// `cloud-credentials`; the BSL has no `spec.credential`. The old lookup of Secret `cloud-credentials`
/// failed the plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_installed_velero_credentials_come_from_its_deployment() {
    let h = Harness::start_with_velero(|v| v.install = VeleroInstall::Helm).await;
    drain_one(&h, "helm-velero").await;
}

/// IRSA (`velero install --no-secret`): no Secret at all, Velero uses its IAM role; snapdrain reads the
/// bucket with its own identity (the AWS default chain, here the role the harness gives it in
/// Settings). Without the grant the sim's S3 refuses snapdrain's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn irsa_velero_is_read_with_snapdrains_own_identity() {
    let h = Harness::start_with_velero(|v| v.credentials = VeleroCredentials::Irsa).await;
    h.grant_snapdrain_role();
    drain_one(&h, "irsa-velero").await;
}

/// An AWS S3 bucket in eu-west-1 and a BSL without `region` or `s3Url`: velero-plugin-for-aws
/// `object_store.go` `Init` looks the region up (HeadBucket, `x-amz-bucket-region`); asking in us-east-1
/// gets S3's 301 PermanentRedirect, which the old default region never got past.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bucket_region_is_looked_up_when_the_location_names_none() {
    let h = Harness::start_with_velero(|v| {
        v.aws_s3 = true;
        v.region = "eu-west-1".into();
    })
    .await;
    drain_one(&h, "bucket-region").await;
}

/// MinIO with a private CA: the BSL carries it in `objectStorage.caCert` (velero-plugin-for-aws
/// `config.go` `WithTLSSettings`); without it the TLS handshake fails (next tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_over_tls_with_the_locations_private_ca() {
    let h = Harness::start_with_velero(|v| v.tls = true).await;
    drain_one(&h, "private-ca").await;
}

/// A certificate no one trusts and the BSL's `config.insecureSkipTLSVerify: "true"`:
/// velero-plugin-for-aws (`velero-plugin-for-aws/object_store.go` `Init` parses it, `config.go`
/// `WithTLSSettings` sets `InsecureSkipVerify`) writes the backups without checking the certificate, and
/// snapdrain reads them back the same way, saying so in the backup record. snapdrain used to refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_over_tls_without_verification_when_the_location_skips_it() {
    let h = Harness::start_with_velero(|v| {
        v.tls = true;
        v.tls_ca = TlsCa::Nobody;
        v.insecure_skip_tls_verify = Some("true".into());
    })
    .await;
    let plan = drain_one(&h, "insecure-tls").await;
    let backups = plan.status.map(|s| s.backups).unwrap_or_default();
    assert!(
        backups.iter().all(|b| b
            .message
            .as_deref()
            .is_some_and(|m| m.contains("insecureSkipTLSVerify"))),
        "each verified record says its certificate was not checked: {backups:#?}"
    );
}

/// The same location without the flag, the CA in the Velero pod's system trust store (a custom image or
/// an injected bundle) and not in the BSL: Velero writes the backups, but snapdrain has neither the CA
/// nor the flag, so verification fails the plan with the TLS error, and nothing is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_untrusted_certificate_fails_verification_with_the_tls_error() {
    let h = Harness::start_with_velero(|v| {
        v.tls = true;
        v.tls_ca = TlsCa::VeleroImage;
    })
    .await;
    let (protected, plan) = run_plan(&h, "untrusted-tls").await;
    // run_plan waited for a terminal phase, which only a status carries.
    let status = plan.status.clone().expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let message = status.message.clone().unwrap_or_default();
    for part in ["TLS handshake", "UnknownIssuer", "insecureSkipTLSVerify"] {
        assert!(message.contains(part), "{part:?} in {message:?}");
    }
    assert!(
        status.backups.iter().all(|b| !b.verified),
        "{:#?}",
        status.backups
    );
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
}

/// A credentials file whose profile also names a `credential_process` (as an attacker with write access
/// to the Velero namespace would add): aws-config (`profile/credentials/exec.rs`) would run it in
/// snapdrain's process, so snapdrain reads static keys only and fails the plan with the key's name,
/// before anything is evicted and without running the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_credential_process_in_velero_secret_is_refused_not_run() {
    use k8s_openapi::api::core::v1::Secret;
    let h = Harness::start().await;
    let secrets: kube::Api<Secret> = kube::Api::namespaced(h.client.clone(), "velero");
    let mut secret = secrets
        .get("cloud-credentials")
        .await
        .expect("Velero's Secret");
    let data = secret.data.get_or_insert_default();
    let file = data.get("cloud").expect("key cloud").0.clone();
    let marker = tempfile::tempdir().expect("temp dir");
    let ran = marker.path().join("ran");
    let mut text = String::from_utf8(file).expect("the file is text");
    text.push_str(&format!("credential_process = touch {}\n", ran.display()));
    data.insert("cloud".into(), k8s_openapi::ByteString(text.into_bytes()));
    secrets
        .replace("cloud-credentials", &Default::default(), &secret)
        .await
        .expect("replace the Secret");
    // The simulated Velero reads only the keys, so it still writes the backups.
    let (protected, plan) = run_plan(&h, "credential-process").await;
    let status = plan.status.clone().expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let message = status.message.clone().unwrap_or_default();
    assert!(
        message.contains("credential_process") && message.contains("static keys"),
        "{message:?}"
    );
    assert!(!ran.exists(), "the credential_process command ran");
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
}

/// Backups written with SSE-C (`config.customerKeyEncryptionFile`, a Secret mounted in the Velero pod):
/// S3 refuses GET and HEAD without the key (400), so verification must send it
/// (velero-plugin-for-aws `object_store.go` sets SSECustomerKey on GetObject/HeadObject).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sse_c_objects_are_read_with_the_customer_key() {
    let h = Harness::start_with_velero(|v| v.sse_c = true).await;
    drain_one(&h, "sse-c").await;
}

/// Backup scope `Pods` (the default; issue "Scale and speed"): a plan backs up the node's own replicas
/// only. The quickstart's postgres and redis StatefulSets have replicas on other nodes too; Velero's
/// record of what it backed up (the simulated Velero's Completed phase lists the PVCs its
/// PodVolumeBackups uploaded, as `namespace/claim`) must name exactly the claims of the StatefulSet pods
/// that were on the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_backs_up_only_the_replicas_on_its_node() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    let own: BTreeSet<String> = protected
        .iter()
        .flat_map(|(pod, claims)| {
            let ns = pod.split('/').next().unwrap_or_default().to_string();
            claims.iter().map(move |c| format!("{ns}/{c}"))
        })
        .collect();
    let all_pvcs =
        kube::Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::all(h.client.clone())
            .list(&Default::default())
            .await
            .expect("list PVCs")
            .items
            .len();
    assert!(
        !own.is_empty() && all_pvcs > own.len(),
        "the node holds some replicas, not all: {own:?} of {all_pvcs} PVCs"
    );
    let plan = {
        let _controller = h.controller().await;
        h.create_plan("own-replicas", json!({"nodes": [node]}))
            .await;
        h.wait_plan("own-replicas", TIMEOUT, |p| p.is_terminal())
            .await
    };
    assert_completed_and_verified(&h, &protected, &plan);
    let names: BTreeSet<String> = plan
        .status
        .iter()
        .flat_map(|s| s.backups.iter().map(|b| b.name.clone()))
        .collect();
    let uploaded: BTreeSet<String> = h
        .audit()
        .iter()
        .filter(|e| e.source == "world" && e.resource == "backups.velero.io")
        .filter(|e| e.detail["phase"] == "Completed")
        .filter(|e| e.name.as_ref().is_some_and(|n| names.contains(n)))
        .flat_map(|e| {
            e.detail["pvcs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        uploaded, own,
        "Velero backed up exactly the PVCs of the node's own StatefulSet pods"
    );
}

/// A bucket writer replaces a backup's objects with a gzip bomb (about 65 KiB that inflates to 65 MiB)
/// and a 17 MiB `velero-backup.json`, through the real S3 SDK with Velero's own keys: verification
/// reads neither past its cap (64 MiB inflated, 16 MiB per object) and fails with the key and the
/// reason, instead of holding the whole object in the controller's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_and_gzip_bomb_objects_are_refused_at_their_cap() {
    use snapdrain::backup::bucket::{self, BucketError, VerifyRequest};
    use snapdrain::backup::verify::{ObjectCheck, VerifyError};
    use std::io::Write;
    let h = Harness::start().await;
    let location = kube::Api::<snapdrain::api::velero::BackupStorageLocation>::namespaced(
        h.client.clone(),
        "velero",
    )
    .list(&Default::default())
    .await
    .expect("list locations")
    .items
    .into_iter()
    .next()
    .expect("the quickstart has a BackupStorageLocation");
    let name = kube::ResourceExt::name_any(&location);
    let target = snapdrain::backup::velero::resolve_location(&h.client, "velero", &name, None)
        .await
        .expect("the location resolves");
    let own = snapdrain_testkit::own_aws_config(&h.cluster);
    let (s3, _) = bucket::connect(&target, &own).await.expect("connect");

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..65 {
        gz.write_all(&zeros).expect("compress");
    }
    let bomb = gz.finish().expect("gzip");
    let big_json = vec![b' '; 17 << 20];
    for (key, body) in [
        ("bomb/bomb-volumeinfo.json.gz", bomb),
        ("bomb/velero-backup.json", big_json),
    ] {
        s3.put_object()
            .bucket(&target.bucket)
            .key(key)
            .body(body.into())
            .send()
            .await
            .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
    }
    for (check, limit) in [
        (
            ObjectCheck::VolumeInfo("bomb/bomb-volumeinfo.json.gz".into()),
            64,
        ),
        (
            ObjectCheck::BackupJson("bomb/velero-backup.json".into()),
            16,
        ),
    ] {
        let result = bucket::verify_backup(
            &s3,
            VerifyRequest {
                target: &target,
                checks: vec![check.clone()],
                uid: "uid",
                pvcs: vec![("db".into(), "data".into())],
                volumes: Vec::new(),
            },
        )
        .await;
        match result {
            Err(BucketError::Invalid(e @ VerifyError::Unreadable { .. })) => assert!(
                e.to_string().contains(&format!("larger than {limit} MiB")),
                "{check:?}: {e}"
            ),
            other => panic!("{check:?}: {other:?}"),
        }
    }
}
