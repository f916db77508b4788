//! The S3 simulator driven by the real aws-sdk-s3 over HTTP.

use std::time::Duration;

use snapdrain_sim::s3::{S3Sim, S3SimConfig, S3Write, S3WriteKind, client_for};
use tokio::sync::broadcast;

async fn start() -> S3Sim {
    S3Sim::start(S3SimConfig {
        buckets: vec!["velero".into(), "other".into()],
        ..Default::default()
    })
    .await
    .expect("start S3 sim")
}

async fn next_write(rx: &mut broadcast::Receiver<S3Write>) -> S3Write {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a write event within 5s")
        .expect("channel open")
}

#[tokio::test]
async fn put_get_head_list_with_auth() {
    let sim = start().await;
    let s3 = sim.client();
    let buckets = s3.list_buckets().send().await.unwrap();
    let mut names: Vec<_> = buckets.buckets().iter().filter_map(|b| b.name()).collect();
    names.sort();
    assert_eq!(names, ["other", "velero"]);

    let body = b"{\"status\":{\"phase\":\"Completed\"}}".to_vec();
    s3.put_object()
        .bucket("velero")
        .key("backups/b1/velero-backup.json")
        .body(body.clone().into())
        .send()
        .await
        .unwrap();
    s3.put_object()
        .bucket("velero")
        .key("backups/b1/b1.tar.gz")
        .body(vec![7u8; 1000].into())
        .send()
        .await
        .unwrap();

    let got = s3
        .get_object()
        .bucket("velero")
        .key("backups/b1/velero-backup.json")
        .send()
        .await
        .unwrap();
    assert_eq!(
        got.body.collect().await.unwrap().into_bytes().as_ref(),
        &body[..]
    );

    let head = s3
        .head_object()
        .bucket("velero")
        .key("backups/b1/b1.tar.gz")
        .send()
        .await
        .unwrap();
    assert_eq!(head.content_length(), Some(1000));

    let list = s3
        .list_objects_v2()
        .bucket("velero")
        .prefix("backups/b1/")
        .send()
        .await
        .unwrap();
    let mut keys: Vec<_> = list.contents().iter().filter_map(|o| o.key()).collect();
    keys.sort();
    assert_eq!(
        keys,
        ["backups/b1/b1.tar.gz", "backups/b1/velero-backup.json"]
    );

    let missing = s3
        .head_object()
        .bucket("velero")
        .key("backups/nope")
        .send()
        .await;
    assert!(missing.is_err(), "a missing object must not be found");
}

#[tokio::test]
async fn wrong_secret_key_is_rejected() {
    let sim = start().await;
    let bad = client_for(
        &sim.endpoint(),
        sim.region(),
        sim.access_key(),
        "wrong-secret",
    );
    let err = bad
        .put_object()
        .bucket("velero")
        .key("x")
        .body(b"x".to_vec().into())
        .send()
        .await
        .expect_err("wrong secret must be refused");
    let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&err).map(str::to_string);
    assert_eq!(code.as_deref(), Some("SignatureDoesNotMatch"), "{err:?}");
    let unknown = client_for(&sim.endpoint(), sim.region(), "nobody", "x");
    assert!(unknown.list_buckets().send().await.is_err());
}

#[tokio::test]
async fn outage_fails_requests_until_cleared() {
    let sim = start().await;
    let s3 = sim.client();
    sim.set_outage(true);
    let err = s3
        .list_objects_v2()
        .bucket("velero")
        .send()
        .await
        .expect_err("outage must fail requests");
    let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&err).map(str::to_string);
    assert_eq!(code.as_deref(), Some("ServiceUnavailable"), "{err:?}");
    sim.set_outage(false);
    s3.list_objects_v2().bucket("velero").send().await.unwrap();
}

#[tokio::test]
async fn writes_are_observed() {
    let sim = start().await;
    let mut rx = sim.subscribe_writes();
    let s3 = sim.client();
    s3.put_object()
        .bucket("velero")
        .key("backups/b2/b2.tar.gz")
        .body(vec![1u8; 42].into())
        .send()
        .await
        .unwrap();
    assert_eq!(
        next_write(&mut rx).await,
        S3Write {
            bucket: "velero".into(),
            key: "backups/b2/b2.tar.gz".into(),
            size: 42,
            kind: S3WriteKind::Put
        }
    );

    // Multipart upload: one event, on completion, with the full size.
    let part = vec![2u8; 5 * 1024 * 1024];
    let up = s3
        .create_multipart_upload()
        .bucket("velero")
        .key("kopia/ns/p1")
        .send()
        .await
        .unwrap();
    let upload_id = up.upload_id().unwrap();
    let p1 = s3
        .upload_part()
        .bucket("velero")
        .key("kopia/ns/p1")
        .upload_id(upload_id)
        .part_number(1)
        .body(part.clone().into())
        .send()
        .await
        .unwrap();
    let p2 = s3
        .upload_part()
        .bucket("velero")
        .key("kopia/ns/p1")
        .upload_id(upload_id)
        .part_number(2)
        .body(vec![3u8; 10].into())
        .send()
        .await
        .unwrap();
    let parts = aws_sdk_s3::types::CompletedMultipartUpload::builder()
        .parts(
            aws_sdk_s3::types::CompletedPart::builder()
                .part_number(1)
                .set_e_tag(p1.e_tag().map(str::to_string))
                .build(),
        )
        .parts(
            aws_sdk_s3::types::CompletedPart::builder()
                .part_number(2)
                .set_e_tag(p2.e_tag().map(str::to_string))
                .build(),
        )
        .build();
    s3.complete_multipart_upload()
        .bucket("velero")
        .key("kopia/ns/p1")
        .upload_id(upload_id)
        .multipart_upload(parts)
        .send()
        .await
        .unwrap();
    let w = next_write(&mut rx).await;
    assert_eq!(w.kind, S3WriteKind::CompleteMultipartUpload);
    assert_eq!(w.size, part.len() as u64 + 10);

    // Fault-injection helpers are writes too, and they really change the bucket.
    sim.overwrite_object("velero", "backups/b2/b2.tar.gz", b"".to_vec())
        .await
        .unwrap();
    let w = next_write(&mut rx).await;
    assert_eq!((w.kind, w.size), (S3WriteKind::Put, 0));
    sim.delete_object("velero", "backups/b2/b2.tar.gz")
        .await
        .unwrap();
    let w = next_write(&mut rx).await;
    assert_eq!(w.kind, S3WriteKind::Delete);
    assert!(
        s3.head_object()
            .bucket("velero")
            .key("backups/b2/b2.tar.gz")
            .send()
            .await
            .is_err()
    );

    // Reads are not writes.
    s3.list_objects_v2().bucket("velero").send().await.unwrap();
    assert!(rx.try_recv().is_err());
}

/// S3 takes keys up to 1,024 bytes (S3 User Guide, "Naming Amazon S3 objects"); Velero writes keys that
/// repeat a 63-character backup name under a prefix. The simulator's file-backed store must hold them all
/// and list them by prefix and delimiter like any other key.
#[tokio::test]
async fn long_keys_up_to_s3s_limit_round_trip_and_list_by_prefix() {
    let sim = start().await;
    let s3 = sim.client();
    let name = "n".repeat(63);
    let dir = format!("cluster-a/backups/{name}/");
    let long = format!("{dir}{name}-csi-volumesnapshotcontents.json.gz");
    let longest = format!("{dir}{}", "k".repeat(1024 - dir.len()));
    for key in [&long, &longest] {
        s3.put_object()
            .bucket("velero")
            .key(key)
            .body(key.as_bytes().to_vec().into())
            .send()
            .await
            .unwrap_or_else(|e| panic!("put {} bytes: {e:?}", key.len()));
        let got = s3
            .get_object()
            .bucket("velero")
            .key(key)
            .send()
            .await
            .unwrap();
        let body = got.body.collect().await.unwrap().into_bytes();
        assert_eq!(body.as_ref(), key.as_bytes());
        let head = s3
            .head_object()
            .bucket("velero")
            .key(key)
            .send()
            .await
            .unwrap();
        assert_eq!(head.content_length(), Some(key.len() as i64));
    }
    let listed = s3
        .list_objects_v2()
        .bucket("velero")
        .prefix(&dir)
        .send()
        .await
        .unwrap();
    let mut keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    keys.sort();
    let mut want = vec![long.as_str(), longest.as_str()];
    want.sort();
    assert_eq!(keys, want);
    let dirs = s3
        .list_objects_v2()
        .bucket("velero")
        .prefix("cluster-a/backups/")
        .delimiter("/")
        .send()
        .await
        .unwrap();
    let prefixes: Vec<&str> = dirs
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix())
        .collect();
    assert_eq!(prefixes, [dir.as_str()]);

    s3.delete_object()
        .bucket("velero")
        .key(&long)
        .send()
        .await
        .unwrap();
    assert!(
        s3.head_object()
            .bucket("velero")
            .key(&long)
            .send()
            .await
            .is_err()
    );

    let too_long = "k".repeat(1025);
    let err = s3
        .put_object()
        .bucket("velero")
        .key(&too_long)
        .body(Vec::new().into())
        .send()
        .await
        .expect_err("S3 refuses keys over 1,024 bytes");
    assert!(format!("{err:?}").contains("KeyTooLongError"), "{err:?}");
}

/// An unknown access key gets AWS S3's 403 `InvalidAccessKeyId` until the identity is granted (an IAM
/// role's keys, as STS hands them to IRSA).
#[tokio::test]
async fn unknown_keys_are_refused_until_granted() {
    let sim = start().await;
    let role = client_for(&sim.endpoint(), sim.region(), "ASIAROLE", "role-secret");
    let err = role
        .get_object()
        .bucket("velero")
        .key("x")
        .send()
        .await
        .expect_err("an unknown key is refused");
    let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&err).map(str::to_string);
    assert_eq!(code.as_deref(), Some("InvalidAccessKeyId"), "{err:?}");
    sim.grant("ASIAROLE", "role-secret");
    role.list_objects_v2()
        .bucket("velero")
        .send()
        .await
        .unwrap();
}

/// A bucket in eu-west-1 asked in us-east-1: AWS S3 answers 301 PermanentRedirect with the bucket's
/// region in `x-amz-bucket-region` (aws-sdk-go-v2 `feature/s3/manager/bucket_region.go` reads it from
/// there), and HeadBucket in the right region carries the header too.
#[tokio::test]
async fn wrong_region_is_redirected_with_the_bucket_region() {
    let sim = S3Sim::start(S3SimConfig {
        region: "eu-west-1".into(),
        bucket_region: Some("eu-west-1".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let wrong = client_for(
        &sim.endpoint(),
        "us-east-1",
        sim.access_key(),
        sim.secret_key(),
    );
    let err = wrong
        .head_bucket()
        .bucket("velero")
        .send()
        .await
        .expect_err("asked in the wrong region");
    let raw = err.raw_response().expect("an HTTP answer");
    assert_eq!(raw.status().as_u16(), 301);
    assert_eq!(raw.headers().get("x-amz-bucket-region"), Some("eu-west-1"));
    let err = wrong
        .get_object()
        .bucket("velero")
        .key("k")
        .send()
        .await
        .expect_err("GET in the wrong region");
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&err),
        Some("PermanentRedirect"),
        "{err:?}"
    );
    let right = sim.client();
    let out = right.head_bucket().bucket("velero").send().await.unwrap();
    assert_eq!(out.bucket_region(), Some("eu-west-1"));
}

/// Over TLS with a private CA: a client trusting only the system roots fails the handshake, one
/// trusting the CA gets through.
#[tokio::test]
async fn tls_with_a_private_ca() {
    let tls = snapdrain_sim::s3::S3Tls::private_ca().unwrap();
    let sim = S3Sim::start(S3SimConfig {
        tls: Some(tls),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(sim.endpoint().starts_with("https://"));
    let untrusting = client_for(
        &sim.endpoint(),
        sim.region(),
        sim.access_key(),
        sim.secret_key(),
    );
    let err = untrusting
        .list_objects_v2()
        .bucket("velero")
        .send()
        .await
        .expect_err("the private CA is not trusted by default");
    assert!(
        matches!(err, aws_sdk_s3::error::SdkError::DispatchFailure(_)),
        "{err:?}"
    );
    sim.client()
        .list_objects_v2()
        .bucket("velero")
        .send()
        .await
        .unwrap();
}

/// The `s3` kind of the simulator's fault rules, through the real SDK: an error by operation in S3's
/// own shape (`SlowDown`, 503; the SDK reads the code from the XML `<Error>`), latency, and an outage
/// window that ends by itself.
#[tokio::test]
async fn fault_rules_fail_operations_with_s3_errors_and_windows_end() {
    use snapdrain_sim::apiserver::faults::{FaultRule, Faults};
    let sim = start().await;
    let faults = std::sync::Arc::new(Faults::default());
    sim.attach_faults(faults.clone());
    let s3 = sim.client();
    s3.put_object()
        .bucket("velero")
        .key("backups/b9/b9.tar.gz")
        .body(vec![1u8; 8].into())
        .send()
        .await
        .unwrap();
    let rule = |v: serde_json::Value| {
        let r: FaultRule = serde_json::from_value(v).unwrap();
        r.validate().unwrap();
        r
    };
    // More failures than the SDK's attempts, so the code reaches the caller.
    faults.add(rule(
        serde_json::json!({"kind": "s3", "operation": "GetObject",
        "code": "SlowDown", "errorRate": 1.0, "times": 10}),
    ));
    let err = s3
        .get_object()
        .bucket("velero")
        .key("backups/b9/b9.tar.gz")
        .send()
        .await
        .expect_err("GetObject is refused");
    let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&err).map(str::to_string);
    assert_eq!(code.as_deref(), Some("SlowDown"), "{err:?}");
    s3.head_object()
        .bucket("velero")
        .key("backups/b9/b9.tar.gz")
        .send()
        .await
        .expect("other operations are untouched");
    faults.set(vec![rule(serde_json::json!({"kind": "s3",
        "code": "ServiceUnavailable", "errorRate": 1.0, "durationMs": 5000}))]);
    let err = s3
        .list_objects_v2()
        .bucket("velero")
        .send()
        .await
        .expect_err("the outage window is open");
    let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&err).map(str::to_string);
    assert_eq!(code.as_deref(), Some("ServiceUnavailable"), "{err:?}");
    snapdrain_testkit::eventually("the outage window closes", || async {
        s3.list_objects_v2()
            .bucket("velero")
            .send()
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    assert!(faults.injected()["s3"] >= 2, "{:?}", faults.injected());
}
