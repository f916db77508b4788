//! `snapdrain sim serve` as a user starts it: one JSON line names every endpoint, and the AWS config
//! file it writes lets an AWS SDK reach the simulated S3 and EC2 with nothing else configured.

use std::process::Stdio;

use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use serde_json::Value;
use snapdrain_testkit::WAIT;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sim_serve_prints_every_endpoint_and_writes_a_working_aws_profile() {
    let dir = tempfile::tempdir().expect("temp dir");
    let aws_file = dir.path().join("aws-config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_snapdrain"))
        .args(["sim", "serve", "--scenario", "quickstart", "--kubeconfig"])
        .arg(dir.path().join("kubeconfig"))
        .arg("--aws-config")
        .arg(&aws_file)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("snapdrain runs");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("sim serve prints its endpoints")
        .expect("stdout reads")
        .expect("a line");
    let endpoints: Value = serde_json::from_str(&line).expect("one JSON line");
    for key in ["apiserver", "kubeconfig", "audit", "faults", "awsConfig"] {
        assert!(endpoints[key].is_string(), "{key} missing: {line}");
    }
    assert_eq!(
        endpoints["s3"]["buckets"],
        serde_json::json!(["velero"]),
        "{line}"
    );
    assert!(endpoints["s3"]["endpoint"].is_string(), "{line}");
    assert!(endpoints["ec2"]["endpoint"].is_string(), "{line}");

    // Only the written profile: no keys, region or endpoint from the environment or the test.
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .profile_files(
            EnvConfigFiles::builder()
                .with_file(EnvConfigFileKind::Config, &aws_file)
                .build(),
        )
        .profile_name(endpoints["awsProfile"].as_str().expect("profile name"))
        .load()
        .await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(true)
            .build(),
    );
    let listed = s3
        .list_objects_v2()
        .bucket("velero")
        .send()
        .await
        .expect("the simulated S3 answers with the profile's endpoint and keys");
    assert!(listed.contents().iter().all(|o| o.key().is_some()));
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let described = ec2
        .describe_instances()
        .send()
        .await
        .expect("the simulated EC2 answers with the profile's endpoint");
    let instances: usize = described
        .reservations()
        .iter()
        .map(|r| r.instances().len())
        .sum();
    assert_eq!(instances, 6, "the quickstart scenario's six nodes");
    child.kill().await.expect("stop sim serve");
}
